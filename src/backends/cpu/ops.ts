// Pure f32 tensor ops of the CPU reference engine. Every other backend's kernels are checked
// against these, so they take plain Float32Arrays, have no dependencies, and say their shapes.
// Layout is row-major; "[rows × cols]" means `cols` is the contiguous dimension.
//
// Where llama.cpp (ggml) rounds to f32 between steps, these do too (Math.fround or a store
// into a Float32Array), so results agree with it to ~1e-6 rather than ~1e-4. Dot products
// accumulate in f64, which is at least as exact as ggml's f32 SIMD lanes.

import type { RopeConfig } from '../../model/config.ts';

const f32 = Math.fround;

/**
 * RMSNorm of each row, times a per-column weight:
 * out[r, :] = (x[r, :] / sqrt(mean(x[r, :]²) + eps)) * weight.
 * x, out: [nRows × n] (may alias); weight: [n]
 */
export function rmsnorm(out: Float32Array, x: Float32Array, weight: Float32Array, nRows: number, n: number, eps: number): void {
  for (let r = 0; r < nRows; r++) {
    const o = r * n;
    let ss = 0;
    // squares rounded to f32, summed in f64 (as ggml does)
    for (let i = 0; i < n; i++) ss += f32(x[o + i]! * x[o + i]!);
    const scale = f32(1 / f32(Math.sqrt(f32(f32(ss / n) + eps))));
    // ggml scales first (rounding to f32), then multiplies by the weight in a separate op
    for (let i = 0; i < n; i++) out[o + i] = f32(x[o + i]! * scale) * weight[i]!;
  }
}

/**
 * y = x · wᵀ for a batch of rows: y[t, o] = Σ_i x[t, i] · w[o, i].
 * x: [nTokens × nIn]; w: [nOut × nIn] (a ggml weight of shape [nIn, nOut]); y: [nTokens × nOut].
 *
 * Loop order for the cache: four weight rows are held while every token's row streams past,
 * so a weight row is read from memory once per call, not once per token; each inner pass
 * computes eight dot products (four rows × two tokens) from six loads.
 */
export function matmul(y: Float32Array, x: Float32Array, w: Float32Array, nTokens: number, nIn: number, nOut: number): void {
  matmulRows(y, x, w, nTokens, nIn, nOut, 0, nOut, 0);
}

/**
 * Like `matmul`, for output rows [rowStart, rowEnd) only, with those weight rows at
 * w[(o - rowStart + wRowOffset) · nIn …]. Lets a caller dequantise a tile of weight rows into
 * a scratch buffer and multiply it without holding the whole matrix in f32.
 * y: [nTokens × nOut] (only columns rowStart..rowEnd are written).
 */
export function matmulRows(
  y: Float32Array,
  x: Float32Array,
  w: Float32Array,
  nTokens: number,
  nIn: number,
  nOut: number,
  rowStart: number,
  rowEnd: number,
  wRowOffset: number,
): void {
  let o = rowStart;
  for (; o + 4 <= rowEnd; o += 4) {
    const w0 = (o - rowStart + wRowOffset) * nIn;
    const w1 = w0 + nIn;
    const w2 = w1 + nIn;
    const w3 = w2 + nIn;
    let t = 0;
    // two tokens × four weight rows per pass: each load feeds four or two multiply-adds
    for (; t + 2 <= nTokens; t += 2) {
      const xa = t * nIn;
      const xb = xa + nIn;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      for (let i = 0; i < nIn; i++) {
        const u = x[xa + i]!;
        const v = x[xb + i]!;
        const p0 = w[w0 + i]!, p1 = w[w1 + i]!, p2 = w[w2 + i]!, p3 = w[w3 + i]!;
        a0 += u * p0;
        a1 += u * p1;
        a2 += u * p2;
        a3 += u * p3;
        b0 += v * p0;
        b1 += v * p1;
        b2 += v * p2;
        b3 += v * p3;
      }
      let yo = t * nOut + o;
      y[yo] = a0;
      y[yo + 1] = a1;
      y[yo + 2] = a2;
      y[yo + 3] = a3;
      yo += nOut;
      y[yo] = b0;
      y[yo + 1] = b1;
      y[yo + 2] = b2;
      y[yo + 3] = b3;
    }
    for (; t < nTokens; t++) {
      const xo = t * nIn;
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (let i = 0; i < nIn; i++) {
        const xv = x[xo + i]!;
        s0 += xv * w[w0 + i]!;
        s1 += xv * w[w1 + i]!;
        s2 += xv * w[w2 + i]!;
        s3 += xv * w[w3 + i]!;
      }
      const yo = t * nOut + o;
      y[yo] = s0;
      y[yo + 1] = s1;
      y[yo + 2] = s2;
      y[yo + 3] = s3;
    }
  }
  for (; o < rowEnd; o++) {
    const w0 = (o - rowStart + wRowOffset) * nIn;
    for (let t = 0; t < nTokens; t++) y[t * nOut + o] = dot(x, t * nIn, w, w0, nIn);
  }
}

/** Σ a[ao + i] · b[bo + i] for i < n, four partial sums in f64. */
export function dot(a: Float32Array, ao: number, b: Float32Array, bo: number, n: number): number {
  let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  let i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[ao + i]! * b[bo + i]!;
    s1 += a[ao + i + 1]! * b[bo + i + 1]!;
    s2 += a[ao + i + 2]! * b[bo + i + 2]!;
    s3 += a[ao + i + 3]! * b[bo + i + 3]!;
  }
  for (; i < n; i++) s0 += a[ao + i]! * b[bo + i]!;
  return s0 + s1 + s2 + s3;
}

/** x[r, :] += bias for every row. x: [nRows × n]; bias: [n] */
export function addBias(x: Float32Array, bias: Float32Array, nRows: number, n: number): void {
  for (let r = 0; r < nRows; r++) {
    const o = r * n;
    for (let i = 0; i < n; i++) x[o + i] = x[o + i]! + bias[i]!;
  }
}

/** x *= c, elementwise in f32 (ggml_scale). */
export function scaleInPlace(x: Float32Array, c: number): void {
  for (let i = 0; i < x.length; i++) x[i] = x[i]! * c;
}

/** Residual connection: x += y, elementwise. x, y: same length */
export function addInPlace(x: Float32Array, y: Float32Array): void {
  for (let i = 0; i < x.length; i++) x[i] = x[i]! + y[i]!;
}

/**
 * cos/sin table of one position, as ggml's rope cache builds it: θ_i = p · base^(-2i/nRot)
 * (the power taken by repeated f32 multiplication, like ggml), divided by the frequency factor
 * of pair i when present; then linear scaling by freqScale, or with YaRN (extFactor > 0) a
 * ramp between the scaled and unscaled angle over the corrected dimensions; cos and sin are
 * multiplied by attnFactor (times YaRN's 1 + 0.1·ln(1/freqScale)).
 * out: [nRot] interleaved (cos θ_0, sin θ_0, cos θ_1, sin θ_1, …)
 */
export function ropeCache(out: Float32Array, position: number, rope: RopeConfig): void {
  const thetaScale = f32(Math.pow(rope.freqBase, f32(-2 / rope.nRot)));
  const yarn = rope.extFactor !== 0;
  const [low, high] = yarn ? yarnCorrDims(rope) : [0, 0];
  const mscale = yarn ? f32(rope.attnFactor * f32(1 + f32(f32(0.1) * f32(Math.log(f32(1 / rope.freqScale)))))) : rope.attnFactor;
  let theta = f32(position);
  for (let i = 0; i < rope.nRot / 2; i++) {
    const ff = rope.freqFactors ? rope.freqFactors[i]! : 1;
    const extrap = f32(theta / ff);
    let angle = f32(rope.freqScale * extrap);
    if (yarn) {
      // rope_yarn_ramp: 1 below `low`, 0 above `high`
      const y = f32(f32(i - low) / Math.max(f32(0.001), f32(high - low)));
      const mix = f32(f32(1 - Math.min(1, Math.max(0, y))) * rope.extFactor);
      angle = f32(f32(angle * f32(1 - mix)) + f32(extrap * mix));
    }
    out[2 * i] = mscale === 1 ? Math.cos(angle) : f32(Math.cos(angle)) * mscale;
    out[2 * i + 1] = mscale === 1 ? Math.sin(angle) : f32(Math.sin(angle)) * mscale;
    theta = f32(theta * thetaScale);
  }
}

/** ggml_rope_yarn_corr_dims: the dimension range YaRN blends over, from beta_fast and beta_slow. */
function yarnCorrDims(rope: RopeConfig): [number, number] {
  const dim = (beta: number) =>
    f32(f32(rope.nRot * f32(Math.log(f32(rope.nCtxOrig / f32(f32(beta * 2) * f32(Math.PI)))))) / f32(2 * f32(Math.log(rope.freqBase))));
  return [Math.max(0, Math.floor(dim(rope.betaFast))), Math.min(rope.nRot - 1, Math.ceil(dim(rope.betaSlow)))];
}

/**
 * Rotary position embedding, in place, for tokens at positions startPos … startPos+nTokens-1.
 * 'normal' rotates adjacent pairs (2i, 2i+1); 'neox' rotates (i, i + nRot/2). Dimensions at
 * and beyond nRot pass through unchanged.
 * x: [nTokens × nHeads × headDim]; cache: scratch of [nRot]
 */
export function rope(
  x: Float32Array,
  nTokens: number,
  nHeads: number,
  headDim: number,
  startPos: number,
  cfg: RopeConfig,
  cache: Float32Array = new Float32Array(cfg.nRot),
): void {
  const half = cfg.nRot / 2;
  for (let t = 0; t < nTokens; t++) {
    ropeCache(cache, startPos + t, cfg);
    for (let h = 0; h < nHeads; h++) {
      const base = (t * nHeads + h) * headDim;
      for (let i = 0; i < half; i++) {
        const c = cache[2 * i]!;
        const s = cache[2 * i + 1]!;
        const a = cfg.mode === 'normal' ? base + 2 * i : base + i;
        const b = cfg.mode === 'normal' ? a + 1 : a + half;
        const x0 = x[a]!;
        const x1 = x[b]!;
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
      }
    }
  }
}

/**
 * Softmax of x[offset … offset+n), in place: exp(x - max) / Σ exp(x - max).
 */
export function softmax(x: Float32Array, offset: number, n: number): void {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (x[offset + i]! > max) max = x[offset + i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const e = f32(Math.exp(x[offset + i]! - max));
    x[offset + i] = e;
    sum += e;
  }
  const inv = f32(1 / sum);
  for (let i = 0; i < n; i++) x[offset + i] = x[offset + i]! * inv;
}

/** SiLU: x · sigmoid(x), as ggml computes it in f32. */
export function silu(x: number): number {
  return f32(x / f32(1 + f32(Math.exp(-x))));
}

/** SwiGLU feed-forward gate: out = silu(gate) ⊙ up. gate, up, out: same length (out may alias gate) */
export function swiglu(out: Float32Array, gate: Float32Array, up: Float32Array): void {
  for (let i = 0; i < out.length; i++) out[i] = silu(gate[i]!) * up[i]!;
}

/**
 * Causal multi-head attention with grouped KV heads over a KV cache.
 * Query token t sits at position startPos + t and sees keys 0 … startPos + t (only the last
 * `window` of them in a sliding-window layer). Query head h reads KV head ⌊h / (nHead /
 * nHeadKv)⌋ (consecutive query heads share a KV head, as in ggml). Scores are q·k × scale.
 *
 * q:      [nTokens × nHead × headDim]
 * kCache: [nCtx × nHeadKv × headDim], positions < startPos + nTokens filled (RoPE applied)
 * vCache: [nCtx × nHeadKv × headDim]
 * out:    [nTokens × nHead × headDim]
 * scores: scratch of at least [startPos + nTokens]
 */
export function attention(
  out: Float32Array,
  q: Float32Array,
  kCache: Float32Array,
  vCache: Float32Array,
  nTokens: number,
  startPos: number,
  nHead: number,
  nHeadKv: number,
  headDim: number,
  scores: Float32Array = new Float32Array(startPos + nTokens),
  scale: number = f32(1 / f32(Math.sqrt(headDim))),
  window = 0,
): void {
  const group = nHead / nHeadKv;
  const kvStride = nHeadKv * headDim; // floats per position in the cache
  const acc = new Float64Array(headDim); // [headDim] one head's output
  for (let t = 0; t < nTokens; t++) {
    const nKeys = startPos + t + 1;
    // llama.cpp masks key p0 for query p1 when p1 - p0 >= window
    const first = window > 0 ? Math.max(0, nKeys - window) : 0;
    const count = nKeys - first;
    for (let h = 0; h < nHead; h++) {
      const qo = (t * nHead + h) * headDim;
      const kvo = Math.floor(h / group) * headDim;
      // scores
      for (let j = 0; j < count; j++) {
        scores[j] = f32(dot(q, qo, kCache, (first + j) * kvStride + kvo, headDim)) * scale;
      }
      // softmax
      softmax(scores, 0, count);
      // weighted sum of values (position-major, so the cache streams; f64 accumulators)
      acc.fill(0, 0, headDim);
      for (let j = 0; j < count; j++) {
        const p = scores[j]!;
        const vo = (first + j) * kvStride + kvo;
        for (let d = 0; d < headDim; d++) acc[d] += p * vCache[vo + d]!;
      }
      for (let d = 0; d < headDim; d++) out[qo + d] = acc[d]!;
    }
  }
}

// the greedy pick is the sampler's; re-exported here beside the other ops for kernel tests
export { argmax } from '../../model/sampler.ts';
