// MXFP4: blocks of 32 elements in 17 bytes = { u8 e; u8 qs[16] }: an E8M0 shared exponent and
// e2m1 nibbles (as Q4_0's: low nibble j, high nibble j + 16), x = 2^(e - 128) * F[nibble] with F
// the e2m1 values doubled. 17-byte blocks start at any byte, hence load_u32_any.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 17u;

var<private> MXFP4: array<f32, 16> = array<f32, 16>(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let e = load_u8(block);
  // ggml_e8m0_to_fp32_half: denormal for e < 2
  let d = bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
  let q = load_u32_any(block + 1u + (j % 16u));
  let nib = (q >> select(0u, 4u, j >= 16u)) & 0x0f0f0f0fu;
  return vec4<f32>(MXFP4[nib & 15u], MXFP4[(nib >> 8u) & 15u], MXFP4[(nib >> 16u) & 15u], MXFP4[nib >> 24u]) * d;
}
