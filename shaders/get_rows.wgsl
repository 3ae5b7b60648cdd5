// Embedding lookup: out[t, :] = dequantised row ids[t] of a (possibly quantised) table. A table
// split into row chunks is looked up chunk by chunk; each dispatch writes only the tokens whose
// id falls inside its chunk.

struct Params {
  k: u32,          // elements per table row (= n_embd)
  rows: u32,       // table rows in this chunk
  row_bytes: u32,  // bytes per table row
  row0: u32,       // id of this chunk's first row
  n_tokens: u32,
  wg_x: u32,       // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;          // [rows × row_bytes]
@group(0) @binding(2) var<storage, read> ids: array<u32>;              // [n_tokens] token ids
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;  // [n_tokens × k] f32

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.y;
  let g = wid.x * WG + lid; // group of 4 elements within the row
  if (t >= p.n_tokens || g * 4u >= p.k) {
    return;
  }
  let id = ids[t];
  if (id < p.row0 || id >= p.row0 + p.rows) {
    return;
  }
  out[(t * p.k) / 4u + g] = dequant4((id - p.row0) * p.row_bytes, g * 4u);
}
