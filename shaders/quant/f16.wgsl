// F16: 2 bytes per element, widened with unpack2x16float (works without shader-f16).
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let off = row_base + k * 2u;
  let lo = unpack2x16float(load_u32_even(off));
  let hi = unpack2x16float(load_u32_even(off + 4u));
  return vec4<f32>(lo, hi);
}
