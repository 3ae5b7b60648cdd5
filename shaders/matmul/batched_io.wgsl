// Parameters and bindings of the batched matmul kernels (mul_mat, mul_mat_tiled):
// out[t, row] = dot(W[row, :], x[t, :]) for the weight rows of one chunk and n_tokens rows of x.
// `dequant4` (from the quant snippet) reads `weights`.

struct Params {
  k: u32,          // elements per weight row (= columns of x); mul_mat_tiled needs a multiple of its TK
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
