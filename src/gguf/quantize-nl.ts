// Quantisers for the non-linear 4-bit types, whose nibbles index a fixed codebook instead of
// an even grid; byte-identical with ggml (quantize_iq4_nl / quantize_iq4_xs with ntry 7 and
// no importance matrix, which ggml_quantize_chunk calls; quantize_row_mxfp4_ref).
//   IQ4_NL (18):  f16 d · u8 qs[16]                                x = d·K[q]
//   IQ4_XS (136): f16 d · u16 scales_h · u8 scales_l[4] · u8 qs[128]  x = d·(ls − 32)·K[q], 8 blocks of 32
//   MXFP4 (17):   u8 e (E8M0 exponent) · u8 qs[16]                x = 2^(e−128)·F[q]
// K = IQ4_NL_VALUES, F = MXFP4_VALUES (e2m1 values, doubled); element j < 16 is the low nibble
// of qs[j], element j + 16 the high nibble, within each block of 32.

import { IQ4_NL_VALUES, MXFP4_VALUES, e8m0Half } from './codebooks.ts';
import { GROUP_MAX_EPS, bestIndexInt8, nearestInt, putF16, signedMax } from './quant-search.ts';

const fr = Math.fround;

const NTRY = 7;

/**
 * ggml's quantize_row_iq4_nl_impl without importance weights for one super-block of `n`
 * values (32 for IQ4_NL, 256 for IQ4_XS) at x[xo]: per 32-block scales from a search over
 * 2·NTRY+1 candidates, then (IQ4_XS) 6-bit block scales under one f16 super-scale.
 * L: scratch [n]; scales: scratch [n / 32]. Writes d, qs and (IQ4_XS) the scale bytes.
 */
function quantizeIq4Block(x: Float32Array, xo: number, n: number, out: Uint8Array, o: number, L: Uint8Array, scales: Float32Array): void {
  const nb = n / 32;
  const values = IQ4_NL_VALUES;
  const qs = o + (nb > 1 ? 8 : 2);
  out.fill(0, qs, qs + n / 2);
  putF16(out, o, 0);
  let maxScale = 0;
  let amaxScale = 0;
  for (let ib = 0; ib < nb; ib++) {
    const xb = xo + 32 * ib;
    const [amax, max] = signedMax(x, xb, 32);
    if (amax < GROUP_MAX_EPS) {
      scales[ib] = 0;
      continue;
    }
    let d = fr(-max / values[0]!);
    let id = fr(1 / d);
    let sumqx = 0;
    let sumq2 = 0;
    for (let j = 0; j < 32; j++) {
      const xj = x[xb + j]!;
      const l = bestIndexInt8(values, fr(id * xj));
      L[32 * ib + j] = l;
      const q = values[l]!;
      const w = fr(xj * xj);
      sumqx = fr(sumqx + fr(fr(w * q) * xj));
      sumq2 = fr(sumq2 + fr(fr(w * q) * q));
    }
    d = sumq2 > 0 ? fr(sumqx / sumq2) : 0;
    let best = fr(d * sumqx);
    for (let itry = -NTRY; itry <= NTRY; itry++) {
      id = fr((itry + values[0]!) / max);
      sumqx = 0;
      sumq2 = 0;
      for (let j = 0; j < 32; j++) {
        const xj = x[xb + j]!;
        const q = values[bestIndexInt8(values, fr(id * xj))]!;
        const w = fr(xj * xj);
        sumqx = fr(sumqx + fr(fr(w * q) * xj));
        sumq2 = fr(sumq2 + fr(fr(w * q) * q));
      }
      if (sumq2 > 0 && fr(sumqx * sumqx) > fr(best * sumq2)) {
        d = fr(sumqx / sumq2);
        best = fr(d * sumqx);
      }
    }
    scales[ib] = d;
    if (Math.abs(d) > amaxScale) {
      amaxScale = Math.abs(d);
      maxScale = d;
    }
  }
  if (nb > 1) {
    // scales_h @2 (u16, 2 bits per block), scales_l @4 (4 bits per block)
    out.fill(0, o + 2, o + 8);
    const d = fr(-maxScale / 32);
    putF16(out, o, d);
    const id = d ? fr(1 / d) : 0;
    let scalesH = 0;
    for (let ib = 0; ib < nb; ib++) {
      const l = Math.max(-32, Math.min(31, nearestInt(fr(id * scales[ib]!))));
      const dl = fr(d * l);
      const idl = dl ? fr(1 / dl) : 0;
      for (let j = 0; j < 32; j++) L[32 * ib + j] = bestIndexInt8(values, fr(idl * x[xo + 32 * ib + j]!));
      const ls = l + 32;
      out[o + 4 + (ib >> 1)]! |= (ls & 0xf) << (4 * (ib % 2));
      scalesH |= (ls >> 4) << (2 * ib);
    }
    out[o + 2] = scalesH & 0xff;
    out[o + 3] = scalesH >> 8;
  } else {
    putF16(out, o, scales[0]!);
    const id = scales[0] ? fr(1 / scales[0]!) : 0;
    for (let j = 0; j < 32; j++) L[j] = bestIndexInt8(values, fr(id * x[xo + j]!));
  }
  for (let i = 0; i < n / 32; i++) {
    for (let j = 0; j < 16; j++) out[qs + 16 * i + j] = L[32 * i + j]! | (L[32 * i + 16 + j]! << 4);
  }
}

export function quantizeIQ4_NL(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(32);
  const scales = new Float32Array(1);
  for (let i = 0; i < x.length / 32; i++) quantizeIq4Block(x, i * 32, 32, out, i * 18, L, scales);
}

export function quantizeIQ4_XS(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(256);
  const scales = new Float32Array(8);
  for (let i = 0; i < x.length / 256; i++) quantizeIq4Block(x, i * 256, 256, out, i * 136, L, scales);
}

/** ggml's best_index_mxfp4: the first codebook entry with the least |F[i]·e − x|. */
function bestIndexMxfp4(x: number, e: number): number {
  let best = 0;
  let bestErr = Math.abs(fr(fr(MXFP4_VALUES[0]! * e) - x));
  for (let i = 1; i < 16; i++) {
    const err = Math.abs(fr(fr(MXFP4_VALUES[i]! * e) - x));
    if (err < bestErr) {
      best = i;
      bestErr = err;
    }
  }
  return best;
}

export function quantizeMXFP4(x: Float32Array, out: Uint8Array): void {
  for (let i = 0; i < x.length / 32; i++) {
    const xo = i * 32;
    const o = i * 17;
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[xo + j]!));
    // log2f rounded to f32, then floorf, as ggml computes the shared exponent
    const e = amax > 0 ? (Math.floor(fr(Math.log2(amax))) - 2 + 127) & 0xff : 0;
    const d = e8m0Half(e);
    out[o] = e;
    for (let j = 0; j < 16; j++) out[o + 1 + j] = bestIndexMxfp4(x[xo + j]!, d) | (bestIndexMxfp4(x[xo + 16 + j]!, d) << 4);
  }
}
