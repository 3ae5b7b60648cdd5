// SwiGLU, in place on the gate: g[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)).

struct Params {
  n: u32,     // elements
  wg_x: u32,  // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> g: array<f32>; // [n] gate in, result out
@group(0) @binding(2) var<storage, read> u: array<f32>;       // [n] up

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n) {
    return;
  }
  let v = g[i];
  g[i] = v / (1.0 + exp(-v)) * u[i];
}
