// The K-quant quantisers beside Q4_K and Q6_K (./quantize.ts), byte-identical with ggml's
// quantize_row_{q2_K,q3_K,q5_K}_ref (every step rounded to f32). Super-blocks of 256 values:
//   Q2_K (84):  u8 scales[16] (4-bit scale | 4-bit min << 4) · u8 qs[64] · f16 d · f16 dmin
//               x = d·sc·q − dmin·m, 16 sub-blocks of 16, q in 0..3
//   Q3_K (110): u8 hmask[32] · u8 qs[64] · u8 scales[12] (16 × 6 bits) · f16 d
//               x = d·(sc − 32)·(q − 4), q's third bit in hmask
//   Q5_K (176): f16 d · f16 dmin · u8 scales[12] (as Q4_K) · u8 qh[32] · u8 qs[128]
//               x = d·sc·q − dmin·m, 8 sub-blocks of 32, q's fifth bit in qh

import { getF16, kScalesMins, kScratch, makeQ3Quants, makeQkx2Quants, nearestInt, putF16, signedMax } from './quant-search.ts';

const fr = Math.fround;
const QK_K = 256;

/** packs four 2-bit values per byte: byte l of each 128-value half holds l, l+32, l+64, l+96 */
function pack2Bit(L: Uint8Array | Int8Array, out: Uint8Array, at: number): void {
  for (let j = 0; j < QK_K; j += 128) {
    for (let l = 0; l < 32; l++) {
      out[at + j / 4 + l] = L[j + l]! | (L[j + l + 32]! << 2) | (L[j + l + 64]! << 4) | (L[j + l + 96]! << 6);
    }
  }
}

export function quantizeQ2_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(QK_K);
  const Laux = new Uint8Array(16);
  const weights = new Float32Array(16);
  const mins = new Float32Array(16);
  const scales = new Float32Array(16);
  for (let i = 0; i < x.length / QK_K; i++) {
    const xb = i * QK_K;
    const o = i * 84; // scales @0, qs @16, d @80, dmin @82
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 16; j++) {
      for (let l = 0; l < 16; l++) weights[l] = Math.abs(x[xb + 16 * j + l]!);
      scales[j] = makeQkx2Quants(16, 3, x, xb + 16 * j, weights, L, 16 * j, Laux, -0.5, fr(0.1), 15, true, mins, j);
      if (scales[j]! > maxScale) maxScale = scales[j]!;
      if (mins[j]! > maxMin) maxMin = mins[j]!;
    }
    if (maxScale > 0) {
      const iscale = fr(15 / maxScale);
      for (let j = 0; j < 16; j++) out[o + j] = nearestInt(fr(iscale * scales[j]!)) & 0xff;
      putF16(out, o + 80, fr(maxScale / 15));
    } else {
      out.fill(0, o, o + 16);
      putF16(out, o + 80, 0);
    }
    if (maxMin > 0) {
      const iscale = fr(15 / maxMin);
      for (let j = 0; j < 16; j++) out[o + j] = (out[o + j]! | (nearestInt(fr(iscale * mins[j]!)) << 4)) & 0xff;
      putF16(out, o + 82, fr(maxMin / 15));
    } else {
      putF16(out, o + 82, 0);
    }
    const dAll = getF16(out, o + 80);
    const dminAll = getF16(out, o + 82);
    for (let j = 0; j < 16; j++) {
      const d = fr(dAll * (out[o + j]! & 0xf));
      if (!d) continue;
      const dm = fr(dminAll * (out[o + j]! >> 4));
      for (let ii = 0; ii < 16; ii++) {
        const l = nearestInt(fr(fr(x[xb + 16 * j + ii]! + dm) / d));
        L[16 * j + ii] = Math.max(0, Math.min(3, l));
      }
    }
    pack2Bit(L, out, o + 16);
  }
}

export function quantizeQ3_K(x: Float32Array, out: Uint8Array): void {
  const L = new Int8Array(QK_K);
  const scales = new Float32Array(16);
  for (let i = 0; i < x.length / QK_K; i++) {
    const xb = i * QK_K;
    const o = i * 110; // hmask @0, qs @32, scales @96, d @108
    for (let j = 0; j < 16; j++) scales[j] = makeQ3Quants(16, 4, x, xb + 16 * j, L, 16 * j);
    const maxScale = signedMax(scales, 0, 16)[1];
    const sc = o + 96;
    out.fill(0, sc, sc + 12);
    if (maxScale) {
      const iscale = fr(-32 / maxScale);
      for (let j = 0; j < 16; j++) {
        const l = Math.max(-32, Math.min(31, (nearestInt(fr(iscale * scales[j]!)) << 24) >> 24)) + 32;
        if (j < 8) out[sc + j] = l & 0xf;
        else out[sc + j - 8]! |= (l & 0xf) << 4;
        out[sc + 8 + (j % 4)]! |= (l >> 4) << (2 * (j >> 2));
      }
      putF16(out, o + 108, fr(1 / iscale));
    } else {
      putF16(out, o + 108, 0);
    }
    const dAll = getF16(out, o + 108);
    for (let j = 0; j < 16; j++) {
      const low = j < 8 ? out[sc + j]! & 0xf : out[sc + j - 8]! >> 4;
      const s = (low | (((out[sc + 8 + (j % 4)]! >> (2 * (j >> 2))) & 3) << 4)) - 32;
      const d = fr(dAll * s);
      if (!d) continue;
      for (let ii = 0; ii < 16; ii++) {
        const l = nearestInt(fr(x[xb + 16 * j + ii]! / d));
        L[16 * j + ii] = Math.max(-4, Math.min(3, l)) + 4;
      }
    }
    // the third bit of value j goes to bit j / 32 of hmask[j % 32]
    out.fill(0, o, o + 32);
    for (let j = 0; j < QK_K; j++) {
      if (L[j]! > 3) {
        out[o + (j % 32)]! |= 1 << (j >> 5);
        L[j] = L[j]! - 4;
      }
    }
    pack2Bit(L, out, o + 32);
  }
}

export function quantizeQ5_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(QK_K);
  const k = kScratch();
  for (let i = 0; i < x.length / QK_K; i++) {
    const xb = i * QK_K;
    const o = i * 176; // d @0, dmin @2, scales @4..15, qh @16..47, qs @48..175
    kScalesMins(x, xb, 31, -0.5, 15, out, o, L, k);
    // 4 groups of 64: qs byte j holds values j and j+32 (low 4 bits); their fifth bits go to qh[j]
    const qh = o + 16;
    out.fill(0, qh, qh + 32);
    let m1 = 1;
    let m2 = 2;
    for (let n = 0, ql = o + 48; n < QK_K; n += 64, ql += 32) {
      for (let j = 0; j < 32; j++) {
        let l1 = L[n + j]!;
        let l2 = L[n + j + 32]!;
        if (l1 > 15) {
          l1 -= 16;
          out[qh + j]! |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          out[qh + j]! |= m2;
        }
        out[ql + j] = l1 | (l2 << 4);
      }
      m1 <<= 2;
      m2 <<= 2;
    }
  }
}
