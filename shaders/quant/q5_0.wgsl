// Q5_0: blocks of 32 elements in 22 bytes = { f16 d; u32 qh; u8 qs[16] }. The low 4 bits of
// element j are a nibble of qs as in Q4_0, its 5th bit is bit j of qh; x = d * (q - 16).
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let d = load_f16(block);
  let qh = load_u32_even(block + 2u);
  let q = load_u32_even(block + 6u + (j % 16u));
  let nib = (q >> select(0u, 4u, j >= 16u)) & 0x0f0f0f0fu;
  return d * (u8x4(nib | high_bits4(qh, j)) - vec4<f32>(16.0));
}
