// ggml-compatible rounding of activations before a matmul with a quantised or f16 weight.
//
// llama.cpp's CPU backend never multiplies a quantised weight by f32 activations: it first
// converts each activation row to the weight type's "vec_dot_type" (f16 for F16 weights,
// bf16 for BF16, Q8_0 blocks of 32 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K
// blocks of 256 for the K-quants and IQ4_XS) and takes integer dot products. That rounding moves logits of a small random
// model by ~0.1, enough to change greedy tokens. Replacing x by the value its quantised form
// stands for (scale × integer) and then multiplying in f32 gives the same sums up to f32
// summation order, so the CPU engine agrees with llama.cpp to ~1e-5 on every weight type.

import { F16_TABLE, bf16ToF32, f32ToBf16, f32ToF16 } from '../../gguf/fp16.ts';
import { GgmlType } from '../../gguf/types.ts';

/** How ggml rounds activations for a weight type ('f32': not at all). */
export type ActivationFormat = 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q8_K';

export function activationFormatFor(weightType: GgmlType): ActivationFormat {
  switch (weightType) {
    case GgmlType.F32:
      return 'f32';
    case GgmlType.F16:
      return 'f16';
    case GgmlType.Q4_0:
    case GgmlType.Q4_1:
    case GgmlType.Q5_0:
    case GgmlType.Q5_1:
    case GgmlType.Q8_0:
    case GgmlType.IQ4_NL:
    case GgmlType.MXFP4:
      // Q8_1 (for Q4_1/Q5_1) has the same scale and integers as Q8_0
      return 'q8_0';
    case GgmlType.BF16:
      return 'bf16';
    default:
      return 'q8_K';
  }
}

const f32 = Math.fround;
/** 1.5 · 2^23: adding it to an f32 rounds to an integer, ties to even (ggml's nearest_int) */
const ROUND_MAGIC = 12582912;

/**
 * Returns x with every row rounded as ggml rounds it for `format` (x itself for 'f32').
 * x: [nRows × n]; returns [nRows × n]
 */
export function roundActivations(x: Float32Array, nRows: number, n: number, format: ActivationFormat): Float32Array {
  if (format === 'f32') return x;
  const out = new Float32Array(nRows * n);
  if (format === 'f16') {
    for (let i = 0; i < nRows * n; i++) out[i] = F16_TABLE[f32ToF16(x[i]!)]!;
    return out;
  }
  if (format === 'bf16') {
    for (let i = 0; i < nRows * n; i++) out[i] = bf16ToF32(f32ToBf16(x[i]!));
    return out;
  }
  const block = format === 'q8_0' ? 32 : 256;
  if (n % block !== 0) return x; // ggml would not run this matmul quantised either
  for (let o = 0; o < nRows * n; o += block) {
    if (format === 'q8_0') roundBlockQ8_0(x, out, o);
    else roundBlockQ8_K(x, out, o);
  }
  return out;
}

/** Q8_0 (as ggml-cpu's x86 quantize_row_q8_0): d = amax/127 stored as f16, q = round(x · 127/amax). */
function roundBlockQ8_0(x: Float32Array, out: Float32Array, o: number): void {
  let amax = 0;
  for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[o + i]!));
  const d = F16_TABLE[f32ToF16(f32(amax / 127))]!;
  const id = amax !== 0 ? f32(127 / amax) : 0;
  for (let i = 0; i < 32; i++) {
    const q = f32(f32(x[o + i]! * id) + ROUND_MAGIC) - ROUND_MAGIC;
    out[o + i] = d * q;
  }
}

/** Q8_K (as ggml's quantize_row_q8_K_ref): scale from the signed value of largest magnitude, d in f32. */
function roundBlockQ8_K(x: Float32Array, out: Float32Array, o: number): void {
  let amax = 0;
  let max = 0;
  for (let i = 0; i < 256; i++) {
    const ax = Math.abs(x[o + i]!);
    if (ax > amax) {
      amax = ax;
      max = x[o + i]!;
    }
  }
  if (amax === 0) {
    out.fill(0, o, o + 256);
    return;
  }
  const iscale = f32(-127 / max);
  const d = f32(1 / iscale);
  for (let i = 0; i < 256; i++) {
    const q = Math.min(127, f32(f32(iscale * x[o + i]!) + ROUND_MAGIC) - ROUND_MAGIC);
    out[o + i] = f32(d * q);
  }
}

/**
 * Quantises rows to Q8_0 as ggml does (same scale and rounding as roundBlockQ8_0), writing the
 * integers (as i16, the form the int8 kernel multiplies) and the f32 value of each block's f16 scale.
 * x: [nRows × n] (n a multiple of 32); q[qOff …]: [nRows × n]; d[dOff …]: [nRows × n/32]
 */
export function quantizeRowsQ8_0(x: Float32Array, nRows: number, n: number, q: Int16Array, qOff: number, d: Float32Array, dOff: number): void {
  const nBlocks = (nRows * n) / 32;
  for (let b = 0; b < nBlocks; b++) {
    const o = b * 32;
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[o + i]!));
    d[dOff + b] = F16_TABLE[f32ToF16(f32(amax / 127))]!;
    const id = amax !== 0 ? f32(127 / amax) : 0;
    for (let i = 0; i < 32; i++) q[qOff + o + i] = f32(f32(x[o + i]! * id) + ROUND_MAGIC) - ROUND_MAGIC;
  }
}

/**
 * The s field of each Q8_1 block of x, as ggml-cpu's x86 quantize_row_q8_1 computes it:
 * f16(d · Σq) with d = amax/127 in f32 (not its f16 rounding) and q Q8_0's integers.
 * x: [nRows × n] (n a multiple of 32); returns [nRows × n/32]
 */
export function q8_1Sums(x: Float32Array, nRows: number, n: number): Float32Array {
  const out = new Float32Array((nRows * n) / 32);
  for (let b = 0; b < out.length; b++) {
    const o = b * 32;
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[o + i]!));
    const d = f32(amax / 127);
    const id = amax !== 0 ? f32(127 / amax) : 0;
    let sum = 0;
    for (let i = 0; i < 32; i++) sum += f32(f32(x[o + i]! * id) + ROUND_MAGIC) - ROUND_MAGIC;
    out[b] = F16_TABLE[f32ToF16(f32(d * sum))]!;
  }
  return out;
}
