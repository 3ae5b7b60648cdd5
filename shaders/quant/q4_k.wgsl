// Q4_K: super-blocks of 256 elements in 144 bytes =
//   { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }
// 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed into `scales`. Elements
// [64c, 64c + 32) are the low nibbles of qs[32c .. 32c + 32) (sub-block 2c), the next 32 the
// high nibbles (sub-block 2c + 1); x = d * scale * nibble - dmin * min.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let chunk = j / 64u;          // which 32 bytes of qs
  let high = (j % 64u) >= 32u;  // low or high nibbles
  let sub = chunk * 2u + select(0u, 1u, high);
  let d = load_f16(block);
  let dmin = load_f16(block + 2u);
  let sm = scale_min_k4(block + 4u, sub);
  let q = load_u32_even(block + 16u + chunk * 32u + (j % 32u));
  let nib = (q >> select(0u, 4u, high)) & 0x0f0f0f0fu;
  return (d * sm.x) * u8x4(nib) - vec4<f32>(dmin * sm.y);
}
