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

import { MeshError } from '../errors.ts';
import { F16_TABLE, f32ToF16 } from './fp16.ts';
import { GgmlType, TYPE_TRAITS } from './types.ts';

const fr = Math.fround;
const QK_K = 256;
const GROUP_MAX_EPS = fr(1e-15);

/** The types this module can produce. */
export const QUANTIZABLE_TYPES: readonly GgmlType[] = [
  GgmlType.F32, GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.Q6_K,
];

/** ggml's nearest_int: round half to even via the 1.5·2^23 trick, on an f32 input. */
function nearestInt(fval: number): number {
  return fr(fval + 12582912) - 12582912;
}

/** C's roundf: half away from zero. */
function roundHalfAway(x: number): number {
  return x < 0 ? -Math.floor(-x + 0.5) : Math.floor(x + 0.5);
}

function putF16(out: Uint8Array, at: number, value: number): void {
  const h = f32ToF16(value);
  out[at] = h & 0xff;
  out[at + 1] = h >> 8;
}

function getF16(out: Uint8Array, at: number): number {
  return F16_TABLE[out[at]! | (out[at + 1]! << 8)]!;
}

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
    let amax = 0;
    let max = 0;
    for (let j = 0; j < 32; j++) {
      const v = x[xo + j]!;
      if (amax < Math.abs(v)) {
        amax = Math.abs(v);
        max = v;
      }
    }
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

// scratch for makeQkx2Quants (sub-blocks are at most 32 values)
const qkxShifted = new Float32Array(32); // [n] f32: x − min for the current min
let qkxMin = 0; // the second result of makeQkx2Quants

/**
 * ggml's make_qkx2_quants for n values with an affine (scale, min) fit: writes L (0..nmax),
 * returns the scale and leaves `qkxMin` (the negated offset) so that x ≈ scale·L − qkxMin.
 * Searches nstep+1 candidate scales and keeps the one with the least weighted squared error.
 */
function makeQkx2Quants(
  n: number, nmax: number, x: Float32Array, xo: number, weights: Float32Array,
  L: Uint8Array, lo: number, Laux: Uint8Array, rmin: number, rdelta: number, nstep: number,
): number {
  let min = x[xo]!;
  let max = x[xo]!;
  let sumW = weights[0]!;
  let sumX = fr(sumW * x[xo]!);
  for (let i = 1; i < n; i++) {
    const xi = x[xo + i]!;
    if (xi < min) min = xi;
    if (xi > max) max = xi;
    const w = weights[i]!;
    sumW = fr(sumW + w);
    sumX = fr(sumX + fr(w * xi));
  }
  if (min > 0) min = 0;
  if (max === min) {
    for (let i = 0; i < n; i++) L[lo + i] = 0;
    qkxMin = -min;
    return 0;
  }
  const shifted = qkxShifted;
  for (let i = 0; i < n; i++) shifted[i] = x[xo + i]! - min; // the store rounds to f32
  let iscale = fr(nmax / fr(max - min));
  let scale = fr(1 / iscale);
  let bestError = 0;
  for (let i = 0; i < n; i++) {
    const l = nearestInt(fr(iscale * shifted[i]!));
    const q = l < 0 ? 0 : l > nmax ? nmax : l;
    L[lo + i] = q;
    const diff = fr(fr(fr(scale * q) + min) - x[xo + i]!);
    bestError = fr(bestError + fr(weights[i]! * fr(diff * diff)));
  }
  if (nstep < 1) {
    qkxMin = -min;
    return scale;
  }
  for (let is = 0; is <= nstep; is++) {
    // `min` moves when a candidate wins, and later candidates start from it (as in ggml)
    iscale = fr(fr(fr(rmin + fr(rdelta * is)) + nmax) / fr(max - min));
    let sumL = 0;
    let sumL2 = 0;
    let sumXL = 0;
    for (let i = 0; i < n; i++) {
      const l0 = nearestInt(fr(iscale * shifted[i]!));
      const l = l0 < 0 ? 0 : l0 > nmax ? nmax : l0;
      Laux[i] = l;
      const wl = fr(weights[i]! * l);
      sumL = fr(sumL + wl);
      sumL2 = fr(sumL2 + fr(wl * l));
      sumXL = fr(sumXL + fr(wl * x[xo + i]!));
    }
    const D = fr(fr(sumW * sumL2) - fr(sumL * sumL));
    if (D > 0) {
      let thisScale = fr(fr(fr(sumW * sumXL) - fr(sumX * sumL)) / D);
      let thisMin = fr(fr(fr(sumL2 * sumX) - fr(sumL * sumXL)) / D);
      if (thisMin > 0) {
        thisMin = 0;
        thisScale = fr(sumXL / sumL2);
      }
      let curError = 0;
      for (let i = 0; i < n; i++) {
        const diff = fr(fr(fr(thisScale * Laux[i]!) + thisMin) - x[xo + i]!);
        curError = fr(curError + fr(weights[i]! * fr(diff * diff)));
      }
      if (curError < bestError) {
        for (let i = 0; i < n; i++) L[lo + i] = Laux[i]!;
        bestError = curError;
        scale = thisScale;
        if (thisMin !== min) {
          min = thisMin;
          for (let i = 0; i < n; i++) shifted[i] = x[xo + i]! - min;
        }
      }
    }
  }
  qkxMin = -min;
  return scale;
}

/** ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the packed 12 bytes. */
function scaleMinK4(j: number, q: Uint8Array, at: number): [number, number] {
  if (j < 4) return [q[at + j]! & 63, q[at + j + 4]! & 63];
  return [
    (q[at + j + 4]! & 0xf) | ((q[at + j - 4]! >> 6) << 4),
    (q[at + j + 4]! >> 4) | ((q[at + j]! >> 6) << 4),
  ];
}

function quantizeQ4_K(x: Float32Array, out: Uint8Array): void {
  const nb = x.length / QK_K;
  const L = new Uint8Array(QK_K);
  const Laux = new Uint8Array(32);
  const weights = new Float32Array(32);
  const mins = new Float32Array(8);
  const scales = new Float32Array(8);
  for (let i = 0; i < nb; i++) {
    const xb = i * QK_K;
    const o = i * 144; // d @0, dmin @2, scales @4..15, qs @16..143
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 8; j++) {
      const xo = xb + 32 * j;
      let sumX2 = 0;
      for (let l = 0; l < 32; l++) sumX2 = fr(sumX2 + fr(x[xo + l]! * x[xo + l]!));
      const avX = fr(Math.sqrt(fr(sumX2 / 32)));
      for (let l = 0; l < 32; l++) weights[l] = fr(avX + Math.abs(x[xo + l]!));
      scales[j] = makeQkx2Quants(32, 15, x, xo, weights, L, 32 * j, Laux, -1, fr(0.1), 20);
      mins[j] = qkxMin;
      if (scales[j]! > maxScale) maxScale = scales[j]!;
      if (mins[j]! > maxMin) maxMin = mins[j]!;
    }
    const invScale = maxScale > 0 ? fr(63 / maxScale) : 0;
    const invMin = maxMin > 0 ? fr(63 / maxMin) : 0;
    const sc = o + 4;
    out.fill(0, sc, sc + 12);
    for (let j = 0; j < 8; j++) {
      // ggml stores nearest_int's result in a uint8_t before clamping to 63
      const ls = Math.min(63, nearestInt(fr(invScale * scales[j]!)) & 0xff);
      const lm = Math.min(63, nearestInt(fr(invMin * mins[j]!)) & 0xff);
      if (j < 4) {
        out[sc + j] = ls;
        out[sc + j + 4] = lm;
      } else {
        out[sc + j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
        out[sc + j - 4]! |= (ls >> 4) << 6;
        out[sc + j]! |= (lm >> 4) << 6;
      }
    }
    putF16(out, o, fr(maxScale / 63));
    putF16(out, o + 2, fr(maxMin / 63));
    const dAll = getF16(out, o);
    const dminAll = getF16(out, o + 2);
    for (let j = 0; j < 8; j++) {
      const [s, m] = scaleMinK4(j, out, sc);
      const d = fr(dAll * s);
      if (!d) continue;
      const dm = fr(dminAll * m);
      for (let ii = 0; ii < 32; ii++) {
        const l = nearestInt(fr(fr(x[xb + 32 * j + ii]! + dm) / d));
        L[32 * j + ii] = Math.max(0, Math.min(15, l));
      }
    }
    // 4 groups of 64 values: byte l holds value l (low nibble) and value l+32 (high nibble)
    let q = o + 16;
    for (let j = 0; j < QK_K; j += 64) {
      for (let l = 0; l < 32; l++) out[q + l] = L[j + l]! | (L[j + l + 32]! << 4);
      q += 32;
    }
  }
}

/**
 * ggml's make_qx_quants with rmse_type 1 (weights x²) and no importance weights: symmetric
 * quantisation of n values to L = q + nmax in [0, 2·nmax), trying 19 candidate scales.
 * Returns the scale.
 */
function makeQxQuants(n: number, nmax: number, x: Float32Array, xo: number, L: Int8Array, lo: number): number {
  let max = 0;
  let amax = 0;
  for (let i = 0; i < n; i++) {
    const ax = Math.abs(x[xo + i]!);
    if (ax > amax) {
      amax = ax;
      max = x[xo + i]!;
    }
  }
  if (amax < GROUP_MAX_EPS) {
    for (let i = 0; i < n; i++) L[lo + i] = 0;
    return 0;
  }
  let iscale = fr(-nmax / max);
  let sumlx = 0;
  let suml2 = 0;
  for (let i = 0; i < n; i++) {
    const xi = x[xo + i]!;
    const l = Math.max(-nmax, Math.min(nmax - 1, nearestInt(fr(iscale * xi))));
    L[lo + i] = l + nmax;
    const w = fr(xi * xi);
    sumlx = fr(sumlx + fr(fr(w * xi) * l));
    suml2 = fr(suml2 + fr(fr(w * l) * l));
  }
  let scale = suml2 ? fr(sumlx / suml2) : 0;
  let best = fr(scale * sumlx);
  for (let is = -9; is <= 9; is++) {
    if (is === 0) continue;
    iscale = fr(-fr(nmax + fr(fr(0.1) * is)) / max);
    sumlx = 0;
    suml2 = 0;
    for (let i = 0; i < n; i++) {
      const xi = x[xo + i]!;
      const l = Math.max(-nmax, Math.min(nmax - 1, nearestInt(fr(iscale * xi))));
      const w = fr(xi * xi);
      sumlx = fr(sumlx + fr(fr(w * xi) * l));
      suml2 = fr(suml2 + fr(fr(w * l) * l));
    }
    if (suml2 > 0 && fr(sumlx * sumlx) > fr(best * suml2)) {
      for (let i = 0; i < n; i++) {
        const l = nearestInt(fr(iscale * x[xo + i]!));
        L[lo + i] = nmax + Math.max(-nmax, Math.min(nmax - 1, l));
      }
      scale = fr(sumlx / suml2);
      best = fr(scale * sumlx);
    }
  }
  return scale;
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
    throw new MeshError('QUANT_UNSUPPORTED_TYPE', `cannot quantise to ${traits?.name ?? `type ${type}`} (supported: F32, F16, Q8_0, Q4_0, Q4_K, Q6_K)`);
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
    case GgmlType.Q8_0: quantizeQ8_0(values, out); break;
    case GgmlType.Q4_0: quantizeQ4_0(values, out); break;
    case GgmlType.Q4_K: quantizeQ4_K(values, out); break;
    case GgmlType.Q6_K: quantizeQ6_K(values, out); break;
  }
  return out;
}
