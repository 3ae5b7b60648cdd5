// The fixed value tables of ggml's non-linear 4-bit types (ggml-common.h) and the E8M0 scale
// of MXFP4, shared by the dequantiser and the quantisers.

/** ggml's kvalues_iq4nl */
export const IQ4_NL_VALUES = Int8Array.of(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
/** ggml's kvalues_mxfp4: the e2m1 values times two */
export const MXFP4_VALUES = Int8Array.of(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** ggml_e8m0_to_fp32_half: 2^(e − 128) as f32 (denormal for e < 2). */
export function e8m0Half(e: number): number {
  u32Scratch[0] = e < 2 ? 0x00200000 << e : (e - 1) << 23;
  return f32Scratch[0]!;
}
