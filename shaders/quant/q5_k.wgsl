// Q5_K: super-blocks of 256 elements in 176 bytes =
//   { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }
// Q4_K's layout and 6-bit scales/mins, with each value's fifth bit in qh: elements
// [64c, 64c + 32) take bit 2c of qh[l], the next 32 bit 2c + 1; x = d * scale * q - dmin * min.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let chunk = j / 64u;
  let high = (j % 64u) >= 32u;
  let sub = chunk * 2u + select(0u, 1u, high);
  let d = load_f16(block);
  let dmin = load_f16(block + 2u);
  let sm = scale_min_k4(block + 4u, sub);
  let q = load_u32_even(block + 48u + chunk * 32u + (j % 32u));
  let nib = (q >> select(0u, 4u, high)) & 0x0f0f0f0fu;
  let hb = ((load_u32_even(block + 16u + (j % 32u)) >> sub) & 0x01010101u) << 4u;
  return (d * sm.x) * u8x4(nib | hb) - vec4<f32>(dmin * sm.y);
}
