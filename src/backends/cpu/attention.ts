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

import { KERNEL_IDS, piecesFor, rowCalls } from './compute-pool.ts';
import type { KernelCall } from './compute-pool.ts';
import type { KvCache } from './kv-cache.ts';

const f32 = Math.fround;

export interface AttentionShape {
  nHead: number;
  nHeadKv: number;
  headDim: number;
}

/** scores scratch is kept under this; larger jobs go through in batches of heads */
const SCORES_BUDGET = 4 << 20;

/**
 * How attention is cut for nTokens queries at pos: units (one per KV head's group of query heads
 * for a single token, one per query head for a chunk) of `rows` score rows, `batch` units at a
 * time, and the bytes of scores scratch that takes.
 */
function plan(s: AttentionShape, nTokens: number, pos: number): { units: number; rows: number; l4: number; batch: number; bytes: number } {
  const l4 = Math.ceil((pos + nTokens) / 4) * 4;
  const units = nTokens === 1 ? s.nHeadKv : s.nHead;
  const rows = nTokens === 1 ? s.nHead / s.nHeadKv : nTokens;
  const batch = Math.max(1, Math.min(units, Math.floor(SCORES_BUDGET / (rows * l4 * 4))));
  return { units, rows, l4, batch, bytes: batch * rows * l4 * 4 };
}

/** bytes of scores scratch attendCached needs for nTokens queries at start position pos */
export function attentionScratchBytes(s: AttentionShape, nTokens: number, pos: number): number {
  return plan(s, nTokens, pos).bytes;
}

/**
 * out = attention of q over layer l of kv, for tokens at positions pos … pos+nTokens−1 (their
 * keys and values already written). q, out: byte offsets of [nTokens × nHead × headDim] f32 in
 * the cache's arena; scores: byte offset of attentionScratchBytes of scratch. Each batch of
 * heads runs its score products on every thread, the softmax here, then the weighted sums.
 */
export function attendCached(kv: KvCache, l: number, s: AttentionShape, q: number, out: number, nTokens: number, pos: number, scores: number): void {
  const { nHead, nHeadKv, headDim: hd } = s;
  const group = nHead / nHeadKv;
  const arena = kv.arena;
  const { units, rows, l4, batch } = plan(s, nTokens, pos);
  const scale = f32(1 / f32(Math.sqrt(hd)));
  const one = nTokens === 1;
  // one token: a KV head's query heads are consecutive in q and out (a batch of `group` rows);
  // a chunk: one query head's tokens, nHead·headDim apart
  const stride = one ? hd * 4 : nHead * hd * 4;
  const unitOffset = (u: number) => (one ? u * group : u) * hd * 4;
  const kvHead = (u: number) => (one ? u : Math.floor(u / group));
  // the kernel takes rows and inputs in fours; odd head sizes run in JS
  const simd = hd % 4 === 0;
  const pieces = Math.max(1, Math.ceil(piecesFor(arena.threads) / batch));
  for (let u0 = 0; u0 < units; u0 += batch) {
    const u1 = Math.min(units, u0 + batch);
    const sc = (u: number) => scores + (u - u0) * rows * l4 * 4; // [rows × l4] of unit u
    const products: KernelCall[] = [];
    for (let u = u0; u < u1; u++) {
      products.push(...rowCalls(KERNEL_IDS.mm_f32, l4, pieces, (r0, r1) => [q + unitOffset(u), stride, kv.keys(l, kvHead(u)), hd * 4, sc(u), l4 * 4, hd, rows, r0, r1]));
    }
    run(arena, products, simd);
    const heap = arena.heap;
    for (let u = u0; u < u1; u++) causalSoftmax(heap, sc(u) >> 2, l4, rows, pos + 1, one ? 0 : 1, scale);
    const sums: KernelCall[] = [];
    for (let u = u0; u < u1; u++) {
      sums.push(...rowCalls(KERNEL_IDS.mm_f32, hd, pieces, (r0, r1) => [sc(u), l4 * 4, kv.values(l, kvHead(u)), kv.capacity * 4, out + unitOffset(u), stride, l4, rows, r0, r1]));
    }
    run(arena, sums, simd);
  }
}

function run(arena: KvCache['arena'], calls: KernelCall[], simd: boolean): void {
  if (simd) arena.run(calls);
  else for (const c of calls) (arena.mmF32Js as (...a: number[]) => void)(...c.args);
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
