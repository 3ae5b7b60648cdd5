// The search routines ggml's reference quantisers share (ggml-quants.c): nearest_int, the
// affine (scale, min) fit of make_qkx2_quants, the symmetric fits of make_qx_quants and
// make_q3_quants, and f16 field access. Every arithmetic step is rounded to f32 as ggml's
// C code rounds it (see ./quantize.ts), so the quantisers built on them are byte-identical.

import { F16_TABLE, f32ToF16 } from './fp16.ts';

const fr = Math.fround;
export const GROUP_MAX_EPS = fr(1e-15);

/** ggml's nearest_int: round half to even via the 1.5·2^23 trick, on an f32 input. */
export function nearestInt(fval: number): number {
  return fr(fval + 12582912) - 12582912;
}

/** C's roundf: half away from zero. */
export function roundHalfAway(x: number): number {
  return x < 0 ? -Math.floor(-x + 0.5) : Math.floor(x + 0.5);
}

export function putF16(out: Uint8Array, at: number, value: number): void {
  const h = f32ToF16(value);
  out[at] = h & 0xff;
  out[at + 1] = h >> 8;
}

export function getF16(out: Uint8Array, at: number): number {
  return F16_TABLE[out[at]! | (out[at + 1]! << 8)]!;
}

// scratch for makeQkx2Quants (sub-blocks are at most 32 values)
const qkxShifted = new Float32Array(32); // [n] f32: x − min for the current min

/**
 * ggml's make_qkx2_quants for n values with an affine (scale, min) fit: writes L (0..nmax),
 * returns the scale and stores the negated offset in mins[mi], so that x ≈ scale·L − mins[mi].
 * Searches nstep+1 candidate scales and keeps the one with the least weighted error (squared,
 * or absolute with useMad).
 */
export function makeQkx2Quants(
  n: number, nmax: number, x: Float32Array, xo: number, weights: Float32Array,
  L: Uint8Array, lo: number, Laux: Uint8Array, rmin: number, rdelta: number, nstep: number,
  useMad: boolean, mins: Float32Array, mi: number,
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
    mins[mi] = -min;
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
    bestError = fr(bestError + fr(weights[i]! * (useMad ? Math.abs(diff) : fr(diff * diff))));
  }
  if (nstep < 1) {
    mins[mi] = -min;
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
        curError = fr(curError + fr(weights[i]! * (useMad ? Math.abs(diff) : fr(diff * diff))));
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
  mins[mi] = -min;
  return scale;
}

/** ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the packed 12 bytes. */
export function scaleMinK4(j: number, q: Uint8Array, at: number): [number, number] {
  if (j < 4) return [q[at + j]! & 63, q[at + j + 4]! & 63];
  return [
    (q[at + j + 4]! & 0xf) | ((q[at + j - 4]! >> 6) << 4),
    (q[at + j + 4]! >> 4) | ((q[at + j]! >> 6) << 4),
  ];
}

/**
 * For l = round(iscale·x) clamped to [−nmax, nmax) over n values: Σ w·x·l and Σ w·l² with
 * w = x², in ggml's f32 steps; writes l + offset to L from lo when `out` is given.
 */
function weightedFit(n: number, nmax: number, x: Float32Array, xo: number, iscale: number, out?: { L: Int8Array; lo: number; offset: number }): [number, number] {
  let sumlx = 0;
  let suml2 = 0;
  for (let i = 0; i < n; i++) {
    const xi = x[xo + i]!;
    const l = Math.max(-nmax, Math.min(nmax - 1, nearestInt(fr(iscale * xi))));
    if (out) out.L[out.lo + i] = l + out.offset;
    const w = fr(xi * xi);
    sumlx = fr(sumlx + fr(fr(w * xi) * l));
    suml2 = fr(suml2 + fr(fr(w * l) * l));
  }
  return [sumlx, suml2];
}

/**
 * ggml's make_qx_quants with rmse_type 1 (weights x²) and no importance weights: symmetric
 * quantisation of n values to L = q + nmax in [0, 2·nmax), trying 19 candidate scales.
 * Returns the scale.
 */
export function makeQxQuants(n: number, nmax: number, x: Float32Array, xo: number, L: Int8Array, lo: number): number {
  const [amax, max] = signedMax(x, xo, n);
  if (amax < GROUP_MAX_EPS) {
    for (let i = 0; i < n; i++) L[lo + i] = 0;
    return 0;
  }
  let [sumlx, suml2] = weightedFit(n, nmax, x, xo, fr(-nmax / max), { L, lo, offset: nmax });
  let scale = suml2 ? fr(sumlx / suml2) : 0;
  let best = fr(scale * sumlx);
  for (let is = -9; is <= 9; is++) {
    if (is === 0) continue;
    const iscale = fr(-fr(nmax + fr(fr(0.1) * is)) / max);
    [sumlx, suml2] = weightedFit(n, nmax, x, xo, iscale);
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

/**
 * ggml's make_q3_quants with do_rmse (weights x²): symmetric quantisation of n values to
 * L = q + nmax in [0, 2·nmax), refined by up to five passes of single-value moves. Returns the scale.
 */
export function makeQ3Quants(n: number, nmax: number, x: Float32Array, xo: number, L: Int8Array, lo: number): number {
  const [amax, max] = signedMax(x, xo, n);
  if (amax < GROUP_MAX_EPS) {
    for (let i = 0; i < n; i++) L[lo + i] = 0;
    return 0;
  }
  let [sumlx, suml2] = weightedFit(n, nmax, x, xo, fr(-nmax / max), { L, lo, offset: 0 });
  for (let itry = 0; itry < 5; itry++) {
    let changed = 0;
    for (let i = 0; i < n; i++) {
      const xi = x[xo + i]!;
      const w = fr(xi * xi);
      const li = L[lo + i]!;
      let slx = fr(sumlx - fr(fr(w * xi) * li));
      if (slx > 0) {
        let sl2 = fr(suml2 - fr(fr(w * li) * li));
        let newL = nearestInt(fr(fr(xi * sl2) / slx));
        newL = Math.max(-nmax, Math.min(nmax - 1, newL));
        if (newL !== li) {
          slx = fr(slx + fr(fr(w * xi) * newL));
          sl2 = fr(sl2 + fr(fr(w * newL) * newL));
          if (sl2 > 0 && fr(fr(slx * slx) * suml2) > fr(fr(sumlx * sumlx) * sl2)) {
            L[lo + i] = newL;
            sumlx = slx;
            suml2 = sl2;
            changed++;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (let i = 0; i < n; i++) L[lo + i] = L[lo + i]! + nmax;
  return suml2 > 0 ? fr(sumlx / suml2) : 0;
}

/** ggml's best_index_int8: the index of the value of `values` (sorted ascending) nearest x. */
export function bestIndexInt8(values: Int8Array, x: number): number {
  const n = values.length;
  if (x <= values[0]!) return 0;
  if (x >= values[n - 1]!) return n - 1;
  let ml = 0;
  let mu = n - 1;
  while (mu - ml > 1) {
    const mav = (ml + mu) >> 1;
    if (x < values[mav]!) mu = mav;
    else ml = mav;
  }
  return fr(x - values[mu - 1]!) < fr(values[mu]! - x) ? mu - 1 : mu;
}

/** The first value of largest magnitude among x[xo … xo+n): [|max|, max] (ggml's amax/max scan). */
export function signedMax(x: Float32Array, xo: number, n: number): [number, number] {
  let amax = 0;
  let max = 0;
  for (let i = 0; i < n; i++) {
    const ax = Math.abs(x[xo + i]!);
    if (ax > amax) {
      amax = ax;
      max = x[xo + i]!;
    }
  }
  return [amax, max];
}

/** Scratch of kScalesMins: one super-block's sub-block fits. */
export interface KScratch {
  Laux: Uint8Array; // [32]
  weights: Float32Array; // [32]
  scales: Float32Array; // [8]
  mins: Float32Array; // [8]
}

export function kScratch(): KScratch {
  return { Laux: new Uint8Array(32), weights: new Float32Array(32), scales: new Float32Array(8), mins: new Float32Array(8) };
}

/**
 * The part Q4_K and Q5_K share (quantize_row_q{4,5}_K_ref): each of the 8 sub-blocks of 32
 * values of the super-block at x[xb] gets an affine fit (weights √(mean x²) + |x|), the fits'
 * scales and mins are quantised to 6 bits under f16 d and dmin (written at out[o], out[o + 2],
 * the 12 packed bytes at out[o + 4]), and L[0 … 256) gets each value's level in 0..nmax.
 */
export function kScalesMins(x: Float32Array, xb: number, nmax: number, rmin: number, nstep: number, out: Uint8Array, o: number, L: Uint8Array, k: KScratch): void {
  let maxScale = 0;
  let maxMin = 0;
  for (let j = 0; j < 8; j++) {
    const xo = xb + 32 * j;
    let sumX2 = 0;
    for (let l = 0; l < 32; l++) sumX2 = fr(sumX2 + fr(x[xo + l]! * x[xo + l]!));
    const avX = fr(Math.sqrt(fr(sumX2 / 32)));
    for (let l = 0; l < 32; l++) k.weights[l] = fr(avX + Math.abs(x[xo + l]!));
    k.scales[j] = makeQkx2Quants(32, nmax, x, xo, k.weights, L, 32 * j, k.Laux, rmin, fr(0.1), nstep, false, k.mins, j);
    if (k.scales[j]! > maxScale) maxScale = k.scales[j]!;
    if (k.mins[j]! > maxMin) maxMin = k.mins[j]!;
  }
  const invScale = maxScale > 0 ? fr(63 / maxScale) : 0;
  const invMin = maxMin > 0 ? fr(63 / maxMin) : 0;
  const sc = o + 4;
  out.fill(0, sc, sc + 12);
  for (let j = 0; j < 8; j++) {
    // ggml stores nearest_int's result in a uint8_t before clamping to 63
    const ls = Math.min(63, nearestInt(fr(invScale * k.scales[j]!)) & 0xff);
    const lm = Math.min(63, nearestInt(fr(invMin * k.mins[j]!)) & 0xff);
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
      L[32 * j + ii] = Math.max(0, Math.min(nmax, l));
    }
  }
}
