// Causal multi-head attention with grouped KV heads over a session's KvCache, as two matrix
// products per head on the matmul kernel (./wasm-f32.ts), so its cost per position is the
// kernel's, not a JS loop's:
//
//   scores[t, j] = (K · q_t)[j] · 1/√headDim        K: [capacity × headDim], rows = positions
//   p[t, :]      = softmax(scores[t, 0 … pos+t])    zero past the causal limit
//   out_t        = Vᵀ · p[t, :]                     Vᵀ: [headDim × capacity]
//
// Query head h reads KV head ⌊h / (nHead / nHeadKv)⌋. With one query token, a KV head's group
// of query heads goes through the kernel as one batch. The kernel sums each output in the same
// order however many tokens it is given, and the zero tail of p adds nothing, so a token's
// result does not depend on the chunk it came in. Matches ops.attention (the reference) to f32
// rounding.

import type { KvCache } from './kv-cache.ts';

const f32 = Math.fround;

export interface AttentionShape {
  nHead: number;
  nHeadKv: number;
  headDim: number;
}

/** bytes of scores scratch attendCached needs for nTokens queries at start position pos */
export function attentionScratchBytes(s: AttentionShape, nTokens: number, pos: number): number {
  const l4 = Math.ceil((pos + nTokens) / 4) * 4;
  return Math.max(nTokens, s.nHead / s.nHeadKv) * l4 * 4;
}

/**
 * out = attention of q over layer l of kv, for tokens at positions pos … pos+nTokens−1 (their
 * keys and values already written). q, out: byte offsets of [nTokens × nHead × headDim] f32 in
 * the cache's arena; scores: byte offset of attentionScratchBytes of scratch.
 */
export function attendCached(kv: KvCache, l: number, s: AttentionShape, q: number, out: number, nTokens: number, pos: number, scores: number): void {
  const { nHead, nHeadKv, headDim: hd } = s;
  const group = nHead / nHeadKv;
  const arena = kv.arena;
  const nKeys = pos + nTokens;
  const l4 = Math.ceil(nKeys / 4) * 4;
  const qStride = nHead * hd * 4; // bytes between tokens of q and out
  const scale = f32(1 / f32(Math.sqrt(hd)));
  // the kernel takes rows and inputs in fours; odd head sizes use its JS form
  const mm = hd % 4 === 0 ? arena.mmF32 : arena.mmF32Js;
  if (nTokens === 1) {
    // a KV head's query heads are consecutive in q and out: one batch of `group` rows
    for (let kvh = 0; kvh < nHeadKv; kvh++) {
      const qh = q + kvh * group * hd * 4;
      mm(qh, hd * 4, kv.keys(l, kvh), hd * 4, scores, l4 * 4, hd, group, 0, l4);
      causalSoftmax(arena.heap, scores >> 2, l4, group, nKeys, 0, scale);
      mm(scores, l4 * 4, kv.values(l, kvh), kv.capacity * 4, out + kvh * group * hd * 4, hd * 4, l4, group, 0, hd);
    }
    return;
  }
  for (let h = 0; h < nHead; h++) {
    const kvh = Math.floor(h / group);
    mm(q + h * hd * 4, qStride, kv.keys(l, kvh), hd * 4, scores, l4 * 4, hd, nTokens, 0, l4);
    causalSoftmax(arena.heap, scores >> 2, l4, nTokens, pos + 1, 1, scale);
    mm(scores, l4 * 4, kv.values(l, kvh), kv.capacity * 4, out + h * hd * 4, qStride, l4, nTokens, 0, hd);
  }
}

/**
 * Row r of the [nRows × width] scores at heap[at …] keeps keys j < first + r·step: scaled,
 * softmax over those (exp(x − max) / Σ, as ops.softmax), zero past them.
 */
function causalSoftmax(heap: Float32Array, at: number, width: number, nRows: number, first: number, step: number, scale: number): void {
  for (let r = 0; r < nRows; r++) {
    const o = at + r * width;
    const n = first + r * step;
    let max = -Infinity;
    for (let j = 0; j < n; j++) {
      const v = f32(heap[o + j]! * scale);
      heap[o + j] = v;
      if (v > max) max = v;
    }
    let sum = 0;
    for (let j = 0; j < n; j++) {
      const e = f32(Math.exp(heap[o + j]! - max));
      heap[o + j] = e;
      sum += e;
    }
    const inv = f32(1 / sum);
    for (let j = 0; j < n; j++) heap[o + j] = heap[o + j]! * inv;
    heap.fill(0, o + n, o + width);
  }
}
