// f16 from the wire → f32: element 2i is the low half of x[i], 2i+1 the high half.

struct Params {
  n_pairs: u32, // elements / 2
  wg_x: u32,    // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;               // [n_pairs] 2 × f16
@group(0) @binding(2) var<storage, read_write> out: array<vec2<f32>>; // [2 × n_pairs] f32

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n_pairs) {
    return;
  }
  out[i] = unpack2x16float(x[i]);
}
