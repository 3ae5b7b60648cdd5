// One Gated DeltaNet layer's per-session state in the chunked form of the delta rule, and the
// token step that prefill and decode share. Positions are cut into chunks of CHUNK at absolute
// multiples of CHUNK; the state S₀ is written once per chunk, at its end. Within a chunk, token
// t (cumulative log-decay G_t, A_tr = β_t (k_t·k_r) e^{G_t − G_r}) gets
//
//   V'_t = β_t v_t − β_t e^{G_t} S₀ᵀk_t − Σ_{r<t} A_tr V'_r           (row t of (I + A)⁻¹ …)
//   o_t  = (e^{G_t} S₀ᵀq_t + Σ_{r≤t} (q_t·k_r) e^{G_t − G_r} V'_r) / √d_k
//   at the chunk's end:  S₀ ← e^{G_L} S₀ + Σ_t e^{G_L − G_t} k_t ⊗ V'_t
//
// which equals the token-by-token recurrence (./delta-net.ts) up to rounding. Every token is
// computed by the same arithmetic whether it came in a prefill of 300 or a decode step of 1,
// so the results do not depend on batching: a repaired stage that replays its history in
// other chunks than it first saw (route/repair.ts) rebuilds the same state, bit for bit.
// The chunk's rows (keys, V', G and the conv inputs) are kept until the chunk ends, so a
// rewind to any position in the current chunk only drops rows.

import type { LinearAttentionConfig } from '../../model/config.ts';
import { l2NormRows } from './delta-net.ts';
import { silu } from './ops.ts';

const f32 = Math.fround;

/**
 * Tokens per chunk. llama.cpp takes 64 (GPU-sized matrix products); here a token costs
 * 2·d² (S₀ᵀk, S₀ᵀq) + ~2·t·d within the chunk + d² amortised for the fold, and the chunk's
 * rows are held per session, so a smaller chunk is both cheaper and smaller.
 */
export const CHUNK = 32;

/** f32 bytes of one layer's state: S₀, the chunk's rows, the conv inputs. */
export function deltaLayerBytes(la: LinearAttentionConfig): number {
  const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = la;
  return 4 * (nV * d * d + CHUNK * (nK * d + nV * d) + (K - 1 + CHUNK) * ch) + 8 * CHUNK * nV;
}

export class DeltaChunkState {
  /** [nV × d × d] the state at the chunk's start, per head s[j·d + i] = S[i][j] */
  s0: Float32Array;
  /** absolute position of the current chunk's first token (a multiple of CHUNK) */
  start = 0;
  /** tokens of the current chunk seen so far */
  rows = 0;
  /** [CHUNK × nK × d] the chunk's L2-normed keys */
  k: Float32Array;
  /** [CHUNK × nV × d] the chunk's V' rows */
  vp: Float32Array;
  /** [CHUNK × nV] cumulative log-decay within the chunk */
  gc: Float64Array;
  /** [(K − 1 + CHUNK) × channels] conv inputs: the K − 1 before the chunk, then the chunk's */
  conv: Float32Array;

  constructor(readonly la: LinearAttentionConfig) {
    const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = la;
    this.s0 = new Float32Array(nV * d * d);
    this.k = new Float32Array(CHUNK * nK * d);
    this.vp = new Float32Array(CHUNK * nV * d);
    this.gc = new Float64Array(CHUNK * nV);
    this.conv = new Float32Array((K - 1 + CHUNK) * ch);
  }

  /** a copy (for a rewind checkpoint) */
  clone(): DeltaChunkState {
    const c = new DeltaChunkState(this.la);
    c.copyFrom(this);
    return c;
  }

  copyFrom(o: DeltaChunkState): void {
    this.s0.set(o.s0);
    this.k.set(o.k);
    this.vp.set(o.vp);
    this.gc.set(o.gc);
    this.conv.set(o.conv);
    this.start = o.start;
    this.rows = o.rows;
  }
}

/** One token's projections, already gated: rows of the batch's arrays. */
export interface TokenInputs {
  /** [convChannels] the q|k|v mix before the conv */
  mixed: Float32Array;
  /** [nV] log-decay g = softplus(α + dt_bias)·ssm_a */
  g: Float32Array;
  /** [nV] β = sigmoid(…) */
  beta: Float32Array;
}

/**
 * Token step: conv over the last K inputs → SiLU → L2-norm of q and k → the chunked delta rule.
 * Writes o [nV × d] (before the gated norm); `beforeFold` is called once before S₀ changes.
 * w: the conv taps [channels × K].
 */
export function deltaStep(st: DeltaChunkState, w: Float32Array, inp: TokenInputs, o: Float32Array, eps: number, beforeFold: () => void): void {
  const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = st.la;
  const t = st.rows;
  // causal depthwise conv: this token's input is row K − 1 + t; it reads rows t … t + K − 1
  st.conv.set(inp.mixed, (K - 1 + t) * ch);
  const x = new Float32Array(ch); // [q | k | v] after conv and SiLU
  for (let c = 0; c < ch; c++) {
    let sum = 0;
    for (let j = 0; j < K; j++) sum = f32(sum + f32(st.conv[(t + j) * ch + c]! * w[c * K + j]!));
    x[c] = silu(sum);
  }
  const kd = nK * d;
  l2NormRows(x, 0, 2 * nK, d, d, eps); // q heads, then k heads
  st.k.set(x.subarray(kd, 2 * kd), t * kd);
  const scale = 1 / Math.sqrt(d);
  const coef = new Float64Array(CHUNK); // A_tr, then (q·k_r) e^{G_t − G_r}
  for (let h = 0; h < nV; h++) {
    const hk = h % nK;
    const q = x.subarray(hk * d, (hk + 1) * d);
    const k = x.subarray(kd + hk * d, kd + (hk + 1) * d);
    const v = x.subarray(2 * kd + h * d, 2 * kd + (h + 1) * d);
    const beta = inp.beta[h]!;
    const G = (t > 0 ? st.gc[(t - 1) * nV + h]! : 0) + inp.g[h]!;
    st.gc[t * nV + h] = G;
    const eG = Math.exp(G);
    const s = st.s0.subarray(h * d * d, (h + 1) * d * d);
    const vp = st.vp.subarray(t * nV * d + h * d, t * nV * d + (h + 1) * d);
    // V'_t = β v − β e^G S₀ᵀk − Σ_{r<t} A_tr V'_r
    for (let r = 0; r < t; r++) coef[r] = beta * dot64(k, st.k, (r * nK + hk) * d, d) * Math.exp(G - st.gc[r * nV + h]!);
    for (let j = 0; j < d; j++) {
      let acc = beta * v[j]! - beta * eG * dot64(k, s, j * d, d);
      for (let r = 0; r < t; r++) acc -= coef[r]! * st.vp[r * nV * d + h * d + j]!;
      vp[j] = acc;
    }
    // o_t = e^G S₀ᵀq + Σ_{r≤t} (q·k_r) e^{G − G_r} V'_r
    for (let r = 0; r <= t; r++) coef[r] = dot64(q, st.k, (r * nK + hk) * d, d) * Math.exp(G - st.gc[r * nV + h]!);
    for (let j = 0; j < d; j++) {
      let acc = eG * dot64(q, s, j * d, d);
      for (let r = 0; r <= t; r++) acc += coef[r]! * st.vp[r * nV * d + h * d + j]!;
      o[h * d + j] = f32(acc * scale);
    }
  }
  st.rows = t + 1;
  if (st.rows === CHUNK) {
    beforeFold();
    fold(st);
  }
}

/** S₀ ← e^{G_L} S₀ + Σ_t e^{G_L − G_t} k_t ⊗ V'_t; the last K − 1 conv inputs move to the front. */
function fold(st: DeltaChunkState): void {
  const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = st.la;
  const L = st.rows;
  const tail = new Float64Array(L);
  for (let h = 0; h < nV; h++) {
    const hk = h % nK;
    const GL = st.gc[(L - 1) * nV + h]!;
    for (let t = 0; t < L; t++) tail[t] = Math.exp(GL - st.gc[t * nV + h]!);
    const eGL = Math.exp(GL);
    const s = st.s0.subarray(h * d * d, (h + 1) * d * d);
    for (let j = 0; j < d; j++) {
      for (let i = 0; i < d; i++) {
        let acc = eGL * s[j * d + i]!;
        for (let t = 0; t < L; t++) acc += tail[t]! * st.k[(t * nK + hk) * d + i]! * st.vp[t * nV * d + h * d + j]!;
        s[j * d + i] = acc;
      }
    }
  }
  st.conv.copyWithin(0, L * ch, (L + K - 1) * ch);
  st.start += L;
  st.rows = 0;
}

/** Σ a[i]·b[bo + i] in f64 */
function dot64(a: Float32Array, b: Float32Array, bo: number, n: number): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += a[i]! * b[bo + i]!;
  return s;
}
