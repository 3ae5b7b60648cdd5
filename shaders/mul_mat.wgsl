// Matrix × matrix for prefill: out[t, row] = dot(W[row, :], x[t, :]). Each thread owns one
// weight row and a tile of TN tokens: it dequantises four weights at a time once and uses them
// for all TN tokens, so dequantisation cost is shared across the batch. No shared memory and no
// barriers; with TN tokens it also serves as a one-row-per-thread matrix × vector.
// Params and bindings (p, weights, x, out): shaders/matmul/batched_io.wgsl.

const WG: u32 = 64u;
const TN: u32 = 4u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.x * WG + lid;
  let t0 = wid.y * TN;
  if (row >= p.rows) {
    return;
  }
  let nt = min(TN, p.n_tokens - t0); // tokens in this tile (fewer in the last one)
  var xrow: array<u32, TN>; // x row of each token in the tile, in vec4s
  for (var j = 0u; j < nt; j++) {
    xrow[j] = (p.x_offset + (t0 + j) * p.x_stride) / 4u;
  }
  var acc: array<f32, TN>;
  let base = row * p.row_bytes;
  for (var k = 0u; k < p.k; k += 4u) {
    let w = dequant4(base, k);
    for (var j = 0u; j < nt; j++) {
      acc[j] += dot(w, x[xrow[j] + k / 4u]);
    }
  }
  for (var j = 0u; j < nt; j++) {
    out[p.out_offset + (t0 + j) * p.out_stride + row] = acc[j];
  }
}
