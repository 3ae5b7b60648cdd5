// Gather-by-expert matrix × vector for decode: out[slot, row] = dot(W_ids[slot][row, :],
// x[slot / x_div, :]), one workgroup per (row, slot) reducing across its threads like
// mul_mat_vec; a workgroup whose slot's expert lies outside this chunk [e0, e0 + n_exp) adds
// nothing. Only the selected experts' rows are read. Rows beyond 65,535 go to dimension y.

struct Params {
  k: u32,          // elements per weight row (= length of an x row)
  rows: u32,       // rows of one expert
  row_bytes: u32,  // bytes per weight row
  x_stride: u32,   // elements between x rows (multiple of 4)
  x_div: u32,      // x row of a slot = slot / x_div
  out_stride: u32, // elements between out rows
  e0: u32,         // first expert of this chunk
  n_exp: u32,      // experts in this chunk
  wg_x: u32,       // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;   // [n_exp × rows × row_bytes]
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // [x rows × x_stride]
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [n_slots × out_stride]
@group(0) @binding(4) var<storage, read> ids: array<u32>;       // [n_slots] expert of each slot

const WG: u32 = 64u; // = the width workgroup_sum expects

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * p.wg_x + wid.x;
  let slot = wid.z;
  let e = ids[slot];
  let live = row < p.rows && e >= p.e0 && e < p.e0 + p.n_exp;
  var acc = 0.0;
  if (live) {
    let base = ((e - p.e0) * p.rows + row) * p.row_bytes;
    let xb = (slot / p.x_div) * p.x_stride;
    for (var k = lid * 4u; k < p.k; k += WG * 4u) {
      acc += dot(dequant4(base, k), x[(xb + k) / 4u]);
    }
  }
  let total = workgroup_sum(acc, lid);
  if (lid == 0u && live) {
    out[slot * p.out_stride + row] = total;
  }
}
