// Q8_0: blocks of 32 elements in 34 bytes = { f16 d; i8 qs[32] }; x = d * q.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn dequant4(row_base: u32, k: u32) -> vec4<f32> {
  let block = row_base + (k / QK) * BLOCK_BYTES;
  let j = k % QK;
  let d = load_f16(block);
  return d * i8x4(load_u32_even(block + 2u + j));
}
