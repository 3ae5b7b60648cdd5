// f32 → ggml block formats, bit-exact with ggml's reference quantisers (`quantize_row_*_ref`
// in ggml-quants.c, which llama.cpp's quantize tool uses when no importance matrix is given).
// ggml computes in f32 with no fused multiply-add in those functions, so every arithmetic step
// here is rounded to f32 with Math.fround (a double op rounded once to f32 equals the f32 op
// for + - * / and sqrt). Block layouts (bytes per block):
//   Q8_0 (34):  f16 d · i8 qs[32]                         x = d·q
//   Q4_0 (18):  f16 d · u8 qs[16] (lo nibble j, hi j+16)  x = d·(q − 8)
//   Q4_K (144): f16 d · f16 dmin · u8 scales[12] (8 × 6-bit scale + 6-bit min) · u8 qs[128]
//               x = d·sc·q − dmin·m, 8 sub-blocks of 32
//   Q6_K (210): u8 ql[128] · u8 qh[64] · i8 scales[16] · f16 d     x = d·sc·(q − 32), 16 × 16
// The other types live beside it: Q4_1/Q5_0/Q5_1 in ./quantize-legacy.ts, Q2_K/Q3_K/Q5_K in
// ./quantize-k.ts, IQ4_NL/IQ4_XS/MXFP4 in ./quantize-nl.ts; their shared searches in
// ./quant-search.ts.

import { MeshError } from '../errors.ts';
import { f32ToBf16, f32ToF16 } from './fp16.ts';
import { GROUP_MAX_EPS, getF16, kScalesMins, kScratch, makeQxQuants, nearestInt, putF16, roundHalfAway, signedMax } from './quant-search.ts';
import { quantizeQ2_K, quantizeQ3_K, quantizeQ5_K } from './quantize-k.ts';
import { quantizeQ4_1, quantizeQ5_0, quantizeQ5_1 } from './quantize-legacy.ts';
import { quantizeIQ4_NL, quantizeIQ4_XS, quantizeMXFP4 } from './quantize-nl.ts';
import { GgmlType, TYPE_TRAITS, typeName } from './types.ts';

const fr = Math.fround;
const QK_K = 256;

/** The types this module can produce. */
export const QUANTIZABLE_TYPES: readonly GgmlType[] = [
  GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_1, GgmlType.Q5_0, GgmlType.Q5_1,
  GgmlType.Q2_K, GgmlType.Q3_K, GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K, GgmlType.IQ4_NL, GgmlType.IQ4_XS, GgmlType.MXFP4,
];

function quantizeQ8_0(x: Float32Array, out: Uint8Array): void {
  const nb = x.length / 32;
  for (let i = 0; i < nb; i++) {
    const xo = i * 32;
    const o = i * 34;
    let amax = 0;
    for (let j = 0; j < 32; j++) {
      const v = Math.abs(x[xo + j]!);
      if (v > amax) amax = v;
    }
    const d = fr(amax / 127);
    const id = d ? fr(1 / d) : 0;
    putF16(out, o, d);
    for (let j = 0; j < 32; j++) out[o + 2 + j] = roundHalfAway(fr(x[xo + j]! * id)) & 0xff;
  }
}

function quantizeQ4_0(x: Float32Array, out: Uint8Array): void {
  const nb = x.length / 32;
  for (let i = 0; i < nb; i++) {
    const xo = i * 32;
    const o = i * 18;
    const max = signedMax(x, xo, 32)[1];
    const d = fr(max / -8);
    const id = d ? fr(1 / d) : 0;
    putF16(out, o, d);
    for (let j = 0; j < 16; j++) {
      const x0 = fr(x[xo + j]! * id);
      const x1 = fr(x[xo + 16 + j]! * id);
      const q0 = Math.min(15, Math.trunc(fr(x0 + 8.5)));
      const q1 = Math.min(15, Math.trunc(fr(x1 + 8.5)));
      out[o + 2 + j] = q0 | (q1 << 4);
    }
  }
}

function quantizeQ4_K(x: Float32Array, out: Uint8Array): void {
  const nb = x.length / QK_K;
  const L = new Uint8Array(QK_K);
  const k = kScratch();
  for (let i = 0; i < nb; i++) {
    const xb = i * QK_K;
    const o = i * 144; // d @0, dmin @2, scales @4..15, qs @16..143
    kScalesMins(x, xb, 15, -1, 20, out, o, L, k);
    // 4 groups of 64 values: byte l holds value l (low nibble) and value l+32 (high nibble)
    let q = o + 16;
    for (let j = 0; j < QK_K; j += 64) {
      for (let l = 0; l < 32; l++) out[q + l] = L[j + l]! | (L[j + l + 32]! << 4);
      q += 32;
    }
  }
}

function quantizeQ6_K(x: Float32Array, out: Uint8Array): void {
  const nb = x.length / QK_K;
  const L = new Int8Array(QK_K);
  const scales = new Float32Array(16);
  for (let i = 0; i < nb; i++) {
    const xb = i * QK_K;
    const o = i * 210; // ql @0..127, qh @128..191, scales @192..207, d @208
    let maxScale = 0;
    let maxAbsScale = 0;
    for (let ib = 0; ib < 16; ib++) {
      const scale = makeQxQuants(16, 32, x, xb + 16 * ib, L, 16 * ib);
      scales[ib] = scale;
      const abs = Math.abs(scale);
      if (abs > maxAbsScale) {
        maxAbsScale = abs;
        maxScale = scale;
      }
    }
    if (maxAbsScale < GROUP_MAX_EPS) {
      out.fill(0, o, o + 210);
      continue;
    }
    const iscale = fr(-128 / maxScale);
    putF16(out, o + 208, fr(1 / iscale));
    for (let ib = 0; ib < 16; ib++) out[o + 192 + ib] = Math.min(127, nearestInt(fr(iscale * scales[ib]!))) & 0xff;
    const dAll = getF16(out, o + 208);
    for (let j = 0; j < 16; j++) {
      const sc = (out[o + 192 + j]! << 24) >> 24; // int8
      const d = fr(dAll * sc);
      if (!d) continue;
      for (let ii = 0; ii < 16; ii++) {
        const l = nearestInt(fr(x[xb + 16 * j + ii]! / d));
        L[16 * j + ii] = Math.max(-32, Math.min(31, l)) + 32;
      }
    }
    // 2 halves of 128 values: ql holds low nibbles of (l, l+64) and (l+32, l+96); qh the top 2 bits of all four
    let ql = o;
    let qh = o + 128;
    for (let j = 0; j < QK_K; j += 128) {
      for (let l = 0; l < 32; l++) {
        const a = L[j + l]!, b = L[j + l + 32]!, c = L[j + l + 64]!, e = L[j + l + 96]!;
        out[ql + l] = (a & 0xf) | ((c & 0xf) << 4);
        out[ql + l + 32] = (b & 0xf) | ((e & 0xf) << 4);
        out[qh + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
      }
      ql += 64;
      qh += 32;
    }
  }
}

/**
 * Quantises `values` (any number of rows laid end to end) to `type`. `nPerRow` is the row
 * length (ne0); it must be a multiple of the type's block size, as ggml requires.
 */
export function quantize(type: GgmlType, values: Float32Array, nPerRow: number = values.length): Uint8Array {
  const traits = TYPE_TRAITS[type];
  if (!traits || !QUANTIZABLE_TYPES.includes(type)) {
    throw new MeshError('QUANT_UNSUPPORTED_TYPE', `cannot quantise to ${traits?.name ?? `type ${type}`} (supported: ${QUANTIZABLE_TYPES.map(typeName).join(', ')})`);
  }
  if (nPerRow <= 0 || nPerRow % traits.blockSize !== 0) {
    throw new MeshError('QUANT_BAD_ROW', `${traits.name} needs rows that are a multiple of ${traits.blockSize} values, got a row of ${nPerRow}`);
  }
  if (values.length % nPerRow !== 0) {
    throw new MeshError('QUANT_BAD_ROW', `${values.length} values are not a whole number of rows of ${nPerRow}`);
  }
  const out = new Uint8Array((values.length / traits.blockSize) * traits.typeSize);
  switch (type) {
    case GgmlType.F32:
      new Float32Array(out.buffer).set(values); // little-endian host, as GGUF is
      break;
    case GgmlType.F16: {
      const h = new Uint16Array(out.buffer);
      for (let i = 0; i < values.length; i++) h[i] = f32ToF16(values[i]!);
      break;
    }
    case GgmlType.BF16: {
      const h = new Uint16Array(out.buffer);
      for (let i = 0; i < values.length; i++) h[i] = f32ToBf16(values[i]!);
      break;
    }
    case GgmlType.Q8_0: quantizeQ8_0(values, out); break;
    case GgmlType.Q4_0: quantizeQ4_0(values, out); break;
    case GgmlType.Q4_1: quantizeQ4_1(values, out); break;
    case GgmlType.Q5_0: quantizeQ5_0(values, out); break;
    case GgmlType.Q5_1: quantizeQ5_1(values, out); break;
    case GgmlType.Q2_K: quantizeQ2_K(values, out); break;
    case GgmlType.Q3_K: quantizeQ3_K(values, out); break;
    case GgmlType.Q4_K: quantizeQ4_K(values, out); break;
    case GgmlType.Q5_K: quantizeQ5_K(values, out); break;
    case GgmlType.Q6_K: quantizeQ6_K(values, out); break;
    case GgmlType.IQ4_NL: quantizeIQ4_NL(values, out); break;
    case GgmlType.IQ4_XS: quantizeIQ4_XS(values, out); break;
    case GgmlType.MXFP4: quantizeMXFP4(values, out); break;
  }
  return out;
}
