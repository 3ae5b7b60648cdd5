// Matrix × vector for decode: out[t, row] = dot(W[row, :], x[t, :]) for every weight row of one
// chunk and every row of x (one session's token, or a batch of sessions' tokens, each row a
// vector of its own). One workgroup per weight row and token; its threads stride over the row
// four elements at a time, dequantising the GGUF blocks in place (`dequant4` from the quant
// snippet), then add up their partial sums (`workgroup_sum` from shaders/reduce/: subgroup
// operations where the adapter has them). A token's sum is the same sequence of operations
// whichever tokens came with it, so a batched decode gives each row the bits it gets alone.
// Rows beyond 65,535 go to the y dimension of the dispatch, tokens to z. (A workgroup over 8
// tokens, dequantising each weight once for all of them, made one session's decode 2.2–2.5×
// slower on SwiftShader — Q4_K and Q8_0 at 1024 × 1024 — and is unmeasured on GPUs: here a
// batch's rows read the weights once each, from cache where the GPU has one.)

struct Params {
  k: u32,          // elements per weight row (= length of x)
  rows: u32,       // weight rows in this chunk
  row_bytes: u32,  // bytes per weight row
  x_offset: u32,   // elements: start of x (multiple of 4)
  out_offset: u32, // elements: where this chunk's row 0 lands in out
  wg_x: u32,       // workgroups along x of the dispatch
  x_stride: u32,   // elements between consecutive x rows (multiple of 4)
  out_stride: u32, // elements between consecutive out rows
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;   // [rows × row_bytes] GGUF blocks
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // [tokens × x_stride] f32 (tokens: the dispatch's z)
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [tokens × out_stride] f32

const WG: u32 = 64u; // = the width workgroup_sum expects

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * p.wg_x + wid.x;
  let t = wid.z;
  var acc = 0.0;
  if (row < p.rows) {
    let base = row * p.row_bytes;
    let x0 = p.x_offset + t * p.x_stride;
    for (var k = lid * 4u; k < p.k; k += WG * 4u) {
      acc += dot(dequant4(base, k), x[(x0 + k) / 4u]);
    }
  }
  let total = workgroup_sum(acc, lid);
  if (lid == 0u && row < p.rows) {
    out[p.out_offset + t * p.out_stride + row] = total;
  }
}
