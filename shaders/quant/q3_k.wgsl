// Q3_K: super-blocks of 256 elements in 110 bytes = { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }.
// Laid out like Q2_K's 2-bit groups (half, group g, sub-block part), each value's third bit in
// bit 4·half + g of hmask[16·part + l], clear meaning "minus 4"; sixteen 6-bit scales (offset by
// 32) packed in 12 bytes: x = d * (scale - 32) * (q - 4·!hbit).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

// 6-bit scale s (0..15) from the 12 bytes at `sc`: low 4 bits from byte s % 8 (nibble s / 8),
// high 2 bits from byte 8 + s % 4 (bits 2·(s / 4)).
fn q3_k_scale(sc: u32, s: u32) -> f32 {
  let low = (load_u8(sc + s % 8u) >> (4u * (s / 8u))) & 0x0fu;
  let high = (load_u8(sc + 8u + s % 4u) >> (2u * (s / 4u))) & 3u;
  return f32(i32(low | (high << 4u)) - 32);
}

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let half = j / 128u;
  let g = (j % 128u) / 32u;
  let part = (j % 32u) / 16u;
  let l = j % 16u;
  let dl = load_f16(block + 108u) * q3_k_scale(block + 96u, half * 8u + g * 2u + part);
  let q = (load_u32_even(block + 32u + half * 32u + part * 16u + l) >> (2u * g)) & 0x03030303u;
  let h = (load_u32_even(block + part * 16u + l) >> (4u * half + g)) & 0x01010101u;
  // 4 where the high bit is clear
  let minus = (h ^ 0x01010101u) << 2u;
  return dl * (u8x4(q) - u8x4(minus));
}
