// Matrix × vector for decode: out[row] = dot(W[row, :], x) for every weight row of one chunk.
// One workgroup per row; its threads stride over the row four elements at a time, dequantising
// the GGUF blocks in place (`dequant4` from the quant snippet), then add up their partial sums
// (`workgroup_sum` from shaders/reduce/: subgroup operations where the adapter has them).
// Rows beyond 65,535 go to the y dimension of the dispatch.

struct Params {
  k: u32,          // elements per weight row (= length of x)
  rows: u32,       // weight rows in this chunk
  row_bytes: u32,  // bytes per weight row
  x_offset: u32,   // elements: start of x (multiple of 4)
  out_offset: u32, // elements: where this chunk's row 0 lands in out
  wg_x: u32,       // workgroups along x of the dispatch
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;   // [rows × row_bytes] GGUF blocks
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // [k] f32
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [rows] f32

const WG: u32 = 64u; // = the width workgroup_sum expects

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * p.wg_x + wid.x;
  var acc = 0.0;
  if (row < p.rows) {
    let base = row * p.row_bytes;
    for (var k = lid * 4u; k < p.k; k += WG * 4u) {
      acc += dot(dequant4(base, k), x[(p.x_offset + k) / 4u]);
    }
  }
  let total = workgroup_sum(acc, lid);
  if (lid == 0u && row < p.rows) {
    out[p.out_offset + row] = total;
  }
}
