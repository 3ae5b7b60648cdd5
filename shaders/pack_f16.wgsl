// f32 → f16 (for the wire, and for an f16 KV cache): out[i] holds elements 2i (low half) and
// 2i+1 (high half).

struct Params {
  n_pairs: u32,    // elements / 2
  wg_x: u32,       // workgroups along x
  x_offset: u32,   // pairs: where the input starts in x
  out_offset: u32, // u32 words: where the output starts in out
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec2<f32>>;   // [2 × n_pairs] f32
@group(0) @binding(2) var<storage, read_write> out: array<u32>; // [n_pairs] 2 × f16

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n_pairs) {
    return;
  }
  out[p.out_offset + i] = pack2x16float(x[p.x_offset + i]);
}
