// Rounds activations the way llama.cpp's CPU backend does before a matmul with a quantised or
// f16 weight (it converts the activation row to the weight's "vec_dot_type" and takes integer
// dot products). Replacing x by the value its rounded form stands for and then multiplying in
// f32 gives ggml's sums up to summation order, so greedy tokens match llama.cpp and the CPU
// reference. Entry points by format: `f16`, `bf16`, `q8_0` (blocks of 32, f16 scale), `q8_k` (blocks
// of 256, f32 scale from the signed value of largest magnitude). One thread per block: no
// barriers. WGSL's round() is ties-to-even, like ggml's nearest_int.

struct Params {
  n: u32,      // f16 / bf16: elements; q8_0 / q8_k: blocks
  wg_x: u32,   // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;          // [n_rows × row] f32
@group(0) @binding(2) var<storage, read_write> out: array<f32>;  // same shape, rounded

const WG: u32 = 64u;

// a / b correctly rounded (WGSL allows 2.5 ulp for division): one Newton step on the residual.
fn div_exact(a: f32, b: f32) -> f32 {
  let r = a / b;
  return r + fma(-r, b, a) / b;
}

// v rounded to the nearest f16 value, ties to even (quantizeToF16 may round either way).
fn round_f16(v: f32) -> f32 {
  let bits = bitcast<u32>(v);
  let sign = bits & 0x80000000u;
  let e = (bits >> 23u) & 0xffu;
  if (e == 0xffu) {
    return v; // inf, nan
  }
  if (e < 113u) {
    // f16 subnormals (and zero): multiples of 2^-24
    return round(v * 16777216.0) / 16777216.0;
  }
  let r = (bits + 0x0fffu + ((bits >> 13u) & 1u)) & ~0x1fffu;
  let out = bitcast<f32>(r);
  if (abs(out) > 65504.0) {
    return bitcast<f32>(sign | 0x7f800000u);
  }
  return out;
}

fn index(wid: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * p.wg_x + wid.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  if (i < p.n) {
    out[i] = round_f16(x[i]);
  }
}

// v rounded to the nearest bf16 value (the top 16 bits of an f32), ties to even, as ggml does.
fn round_bf16(v: f32) -> f32 {
  let bits = bitcast<u32>(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return v; // nan
  }
  return bitcast<f32>((bits + 0x7fffu + ((bits >> 16u) & 1u)) & 0xffff0000u);
}

@compute @workgroup_size(WG)
fn bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  if (i < p.n) {
    out[i] = round_bf16(x[i]);
  }
}

@compute @workgroup_size(WG)
fn q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let b = index(wid, lid);
  if (b >= p.n) {
    return;
  }
  let o = b * 32u;
  var amax = 0.0;
  for (var i = 0u; i < 32u; i++) {
    amax = max(amax, abs(x[o + i]));
  }
  let d = round_f16(div_exact(amax, 127.0));
  let id = select(0.0, div_exact(127.0, amax), amax != 0.0);
  for (var i = 0u; i < 32u; i++) {
    out[o + i] = d * round(x[o + i] * id);
  }
}

@compute @workgroup_size(WG)
fn q8_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let b = index(wid, lid);
  if (b >= p.n) {
    return;
  }
  let o = b * 256u;
  var amax = 0.0;
  var vmax = 0.0;
  for (var i = 0u; i < 256u; i++) {
    let ax = abs(x[o + i]);
    if (ax > amax) {
      amax = ax;
      vmax = x[o + i];
    }
  }
  if (amax == 0.0) {
    for (var i = 0u; i < 256u; i++) {
      out[o + i] = 0.0;
    }
    return;
  }
  let iscale = div_exact(-127.0, vmax);
  let d = div_exact(1.0, iscale);
  for (var i = 0u; i < 256u; i++) {
    out[o + i] = d * min(127.0, round(iscale * x[o + i]));
  }
}
