// F32: 4 bytes per element.
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

// Elements [k, k + 4) of the row whose data starts at byte `row_base`; k is a multiple of 4.
fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let w = (row_base >> 2u) + k;
  return vec4<f32>(bitcast<f32>(weights[w]), bitcast<f32>(weights[w + 1u]), bitcast<f32>(weights[w + 2u]), bitcast<f32>(weights[w + 3u]));
}
