// Matrix × matrix for prefill: out[t, row] = dot(W[row, :], x[t, :]). Each thread owns one
// weight row and a tile of TN tokens: it dequantises four weights at a time once and uses them
// for all TN tokens, so dequantisation cost is shared across the batch. No shared memory and no
// barriers; with TN tokens it also serves as a one-row-per-thread matrix × vector.

struct Params {
  k: u32,          // elements per weight row (= columns of x)
  rows: u32,       // weight rows in this chunk
  row_bytes: u32,  // bytes per weight row
  n_tokens: u32,   // rows of x
  x_offset: u32,   // elements: start of x row 0 (multiple of 4)
  x_stride: u32,   // elements between consecutive x rows (multiple of 4)
  out_offset: u32, // elements: where (token 0, chunk row 0) lands in out
  out_stride: u32, // elements between consecutive out rows
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;   // [rows × row_bytes] GGUF blocks
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // [n_tokens × x_stride] f32
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [n_tokens × out_stride] f32

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
