// Q6_K: super-blocks of 256 elements in 210 bytes =
//   { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }
// Each half of 128 elements uses 64 bytes of ql and 32 of qh. Within a half, quarter q (0..3)
// of 32 elements takes the low (q < 2) or high (q >= 2) nibbles of ql[32 * (q % 2) + l] and
// bits 2q..2q+1 of qh[l]; x = d * scales[8 * half + l / 16 + 2q] * (6-bit value - 32).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let half = j / 128u;
  let quarter = (j % 128u) / 32u;
  let l = j % 32u;
  let ql = load_u32_even(block + half * 64u + (quarter % 2u) * 32u + l);
  let qh = load_u32_even(block + 128u + half * 32u + l);
  let lo = (ql >> select(0u, 4u, quarter >= 2u)) & 0x0f0f0f0fu;
  let hi = ((qh >> (2u * quarter)) & 0x03030303u) << 4u;
  let sc_byte = load_u8(block + 192u + half * 8u + l / 16u + 2u * quarter);
  let scale = f32(bitcast<i32>(sc_byte << 24u) >> 24u);
  let d = load_f16(block + 208u);
  return (d * scale) * (u8x4(lo | hi) - vec4<f32>(32.0));
}
