// Q5_1: blocks of 32 elements in 24 bytes = { f16 d; f16 m; u32 qh; u8 qs[16] }: Q5_0's 5-bit
// values with a min instead of an offset; x = d * q + m.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let d = load_f16(block);
  let m = load_f16(block + 2u);
  let qh = load_u32_even(block + 4u);
  let q = load_u32_even(block + 8u + (j % 16u));
  let nib = (q >> select(0u, 4u, j >= 16u)) & 0x0f0f0f0fu;
  return d * u8x4(nib | high_bits4(qh, j)) + vec4<f32>(m);
}
