// IQ4_XS: super-blocks of 256 elements in 136 bytes = { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }.
// Eight blocks of 32 with 6-bit scales (offset by 32; low 4 bits in scales_l, high 2 in
// scales_h), nibbles (as IQ4_NL) indexing the IQ4_NL codebook: x = d * (ls - 32) * IQ4NL[nibble].
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

var<private> IQ4NL: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let ib = j / 32u;
  let jj = j % 32u;
  let low = (load_u8(block + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0x0fu;
  let high = (load_u16(block + 2u) >> (2u * ib)) & 3u;
  let dl = load_f16(block) * f32(i32(low | (high << 4u)) - 32);
  let q = load_u32_even(block + 8u + ib * 16u + (jj % 16u));
  let nib = (q >> select(0u, 4u, jj >= 16u)) & 0x0f0f0f0fu;
  return dl * vec4<f32>(IQ4NL[nib & 15u], IQ4NL[(nib >> 8u) & 15u], IQ4NL[(nib >> 16u) & 15u], IQ4NL[nib >> 24u]);
}
