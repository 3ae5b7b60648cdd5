// x[x_offset + i] *= c for i < n (ggml_scale): Gemma's embedding scale, and the query scaling
// of Gemma 3 and Phi-3 before attention.

struct Params {
  n: u32,         // elements
  wg_x: u32,      // workgroups along x
  x_offset: u32,  // elements: where x starts
  c: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n) {
    return;
  }
  x[p.x_offset + i] *= p.c;
}
