// GeGLU, in place on the gate, as ggml's CPU backend takes it (GGML_GELU_FP16): g is rounded to
// f16 and its GELU looked up in the host-built table of f16-rounded GELU values
// (cpu/gelu.ts's, so both backends agree bit for bit); |g| ≥ 10 passes through or gives 0.
// g[i] = gelu(g[i]) * u[i].

struct Params {
  n: u32,     // elements
  wg_x: u32,  // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> g: array<f32>; // [n] gate in, result out
@group(0) @binding(2) var<storage, read> u: array<f32>;       // [n] up
@group(0) @binding(3) var<storage, read> table: array<f32>;   // [65536] GELU by f16 bit pattern

const WG: u32 = 64u;

// the f16 bit pattern nearest v, ties to even (|v| < 10 here, so no overflow or nan)
fn f16_bits(v: f32) -> u32 {
  let bits = bitcast<u32>(v);
  let sign = (bits >> 16u) & 0x8000u;
  let e = i32((bits >> 23u) & 0xffu) - 127 + 15;
  var mant = bits & 0x7fffffu;
  if (e <= 0) {
    if (e < -10) {
      return sign;
    }
    mant |= 0x800000u;
    let shift = u32(14 - e);
    let half = 1u << (shift - 1u);
    let rest = mant & ((1u << shift) - 1u);
    var h = mant >> shift;
    if (rest > half || (rest == half && (h & 1u) == 1u)) {
      h += 1u;
    }
    return sign | h;
  }
  var h = (u32(e) << 10u) | (mant >> 13u);
  let rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u)) {
    h += 1u;
  }
  return sign | h;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n) {
    return;
  }
  let v = g[i];
  var a = 0.0;
  if (v >= 10.0) {
    a = v;
  } else if (v > -10.0) {
    a = table[f16_bits(v)];
  }
  g[i] = a * u[i];
}
