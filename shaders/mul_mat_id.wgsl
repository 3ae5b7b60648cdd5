// Grouped expert matmul (prefill, and decode where barriers are slow): for every expert of
// this chunk, out[slot, row] = dot(W_e[row, :], x[slot / x_div, :]) over the slots routed to
// it (moe_group's lists). Each thread owns one row of one expert and walks that expert's slots
// TN at a time, dequantising its weights once per TN slots: only routed experts' weights are
// read. Weights of a chunk hold experts [e0, e0 + gridDim.y), `rows` rows each.

struct Params {
  k: u32,          // elements per weight row (= columns of x)
  rows: u32,       // rows of one expert
  row_bytes: u32,  // bytes per weight row
  x_stride: u32,   // elements between x rows (multiple of 4)
  x_div: u32,      // x row of a slot = slot / x_div (k_used: token rows; 1: one row per slot)
  out_stride: u32, // elements between out rows (one per slot)
  e0: u32,         // first expert of this chunk
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;   // [experts × rows × row_bytes] GGUF blocks
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;   // [x rows × x_stride] f32
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [n_slots × out_stride] f32
@group(0) @binding(4) var<storage, read> slots: array<u32>;     // [n_slots] grouped by expert
@group(0) @binding(5) var<storage, read> offsets: array<u32>;   // [n_expert + 1]

const WG: u32 = 64u;
const TN: u32 = 4u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.x * WG + lid;
  let e = p.e0 + wid.y;
  if (row >= p.rows) {
    return;
  }
  let base = (wid.y * p.rows + row) * p.row_bytes;
  let end = offsets[e + 1u];
  for (var s0 = offsets[e]; s0 < end; s0 += TN) {
    let nt = min(TN, end - s0);
    var xrow: array<u32, TN>;
    for (var j = 0u; j < nt; j++) {
      xrow[j] = (slots[s0 + j] / p.x_div) * p.x_stride / 4u;
    }
    // explicitly zeroed: a declaration inside the loop was seen to keep the last tile's sums
    var acc = array<f32, TN>(0.0, 0.0, 0.0, 0.0);
    for (var kk = 0u; kk < p.k; kk += 4u) {
      let w = dequant4(base, kk);
      for (var j = 0u; j < nt; j++) {
        acc[j] += dot(w, x[xrow[j] + kk / 4u]);
      }
    }
    for (var j = 0u; j < nt; j++) {
      out[slots[s0 + j] * p.out_stride + row] = acc[j];
    }
  }
}
