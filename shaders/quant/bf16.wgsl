// BF16: 2 bytes per element, the top half of an f32 (widened by a shift).
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let lo = load_u32_even(row_base + k * 2u);
  let hi = load_u32_even(row_base + k * 2u + 4u);
  return vec4<f32>(bitcast<f32>(lo << 16u), bitcast<f32>(lo & 0xffff0000u), bitcast<f32>(hi << 16u), bitcast<f32>(hi & 0xffff0000u));
}
