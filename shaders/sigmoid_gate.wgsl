// Gated attention's output gate, in place: x[r·cols + j] *= sigmoid(g[g_offset + r·g_stride + j])
// for rows r, columns j < cols (Qwen3.5's full-attention blocks: the gate is the second half of
// each head's q projection).

struct Params {
  n: u32,        // rows × cols
  cols: u32,
  g_offset: u32,
  g_stride: u32,
  wg_x: u32,     // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n) {
    return;
  }
  let r = i / p.cols;
  let j = i % p.cols;
  x[i] = x[i] * (1.0 / (1.0 + exp(-g[p.g_offset + r * p.g_stride + j])));
}
