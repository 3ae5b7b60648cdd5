// IQ4_NL: blocks of 32 elements in 18 bytes = { f16 d; u8 qs[16] }, nibbles as in Q4_0 but
// indexing a fixed non-linear codebook: x = d * IQ4NL[nibble].
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

var<private> IQ4NL: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let d = load_f16(block);
  let q = load_u32_even(block + 2u + (j % 16u));
  let nib = (q >> select(0u, 4u, j >= 16u)) & 0x0f0f0f0fu;
  return d * vec4<f32>(IQ4NL[nib & 15u], IQ4NL[(nib >> 8u) & 15u], IQ4NL[(nib >> 16u) & 15u], IQ4NL[nib >> 24u]);
}
