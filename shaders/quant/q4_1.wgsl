// Q4_1: blocks of 32 elements in 20 bytes = { f16 d; f16 m; u8 qs[16] }. Element j < 16 is the
// low nibble of qs[j], element j >= 16 the high nibble of qs[j - 16]; x = d * nibble + m.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let d = load_f16(block);
  let m = load_f16(block + 2u);
  let q = load_u32_even(block + 4u + (j % 16u));
  let nib = (q >> select(0u, 4u, j >= 16u)) & 0x0f0f0f0fu;
  return d * u8x4(nib) + vec4<f32>(m);
}
