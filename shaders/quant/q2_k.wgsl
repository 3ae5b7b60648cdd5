// Q2_K: super-blocks of 256 elements in 84 bytes = { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }.
// Each half of 128 elements uses 32 bytes of qs; within a half, group g (0..3) of 32 elements is
// bits 2g..2g+1 of those bytes, in two sub-blocks of 16 with their own scale byte
// (scale = low nibble, min = high nibble): x = d * scale * q - dmin * min.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 84u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let half = j / 128u;
  let g = (j % 128u) / 32u;
  let part = (j % 32u) / 16u;
  let l = j % 16u;
  let sc = load_u8(block + half * 8u + g * 2u + part);
  let d = load_f16(block + 80u);
  let dmin = load_f16(block + 82u);
  let q = (load_u32_even(block + 16u + half * 32u + part * 16u + l) >> (2u * g)) & 0x03030303u;
  return (d * f32(sc & 0x0fu)) * u8x4(q) - vec4<f32>(dmin * f32(sc >> 4u));
}
