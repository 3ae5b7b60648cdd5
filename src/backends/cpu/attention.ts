// Causal multi-head attention with grouped KV heads over a session's KvCache, as two matrix
// products per head on the matmul kernel with the softmax between, all in WebAssembly (one
// `attn` call per unit of rows, ./wasm-attention.ts), so its cost per position is the kernel's,
// not a JS loop's, and worker threads share the heads:
//
//   scores[t, j] = (K · q_t)[j] · 1/√headDim        K: [capacity × headDim], rows = positions
//   p[t, :]      = softmax(scores[t, 0 … pos+t])    zero past the causal limit
//   out_t        = Vᵀ · p[t, :]                     Vᵀ: [headDim × capacity]
//
// Query head h reads KV head ⌊h / (nHead / nHeadKv)⌋. With one query token, a KV head's group
// of query heads goes through the kernel as one batch. The kernel sums each output in the same
// order however many tokens it is given, and the zero tail of p adds nothing, so a token's
// result does not depend on the chunk it came in. Matches ops.attention (the reference) to f32
// rounding. Without SIMD (or with a head size not a multiple of 4) the same steps run in JS.

import { KERNEL_IDS, piecesFor } from './compute-pool.ts';
import type { KernelCall } from './compute-pool.ts';
import type { KvCache } from './kv-cache.ts';
import { softmax } from './ops.ts';

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
 * units is one job of `attn` calls (scores, softmax, weighted sum of some rows of a unit), which
 * the arena's threads share.
 */
export function attendCached(
  kv: KvCache,
  l: number,
  s: AttentionShape,
  q: number,
  out: number,
  nTokens: number,
  pos: number,
  scores: number,
  scale = f32(1 / f32(Math.sqrt(s.headDim))),
  window = 0,
): void {
  const { nHead, nHeadKv, headDim: hd } = s;
  const group = nHead / nHeadKv;
  const arena = kv.arena;
  const { units, rows, l4, batch } = plan(s, nTokens, pos);
  const scaleBits = new Int32Array(Float32Array.of(scale).buffer)[0]!;
  const one = nTokens === 1;
  // one token: a KV head's query heads are consecutive in q and out (a batch of `group` rows);
  // a chunk: one query head's tokens, nHead·headDim apart
  const stride = one ? hd * 4 : nHead * hd * 4;
  const step = one ? 0 : 1;
  const unitOffset = (u: number) => (one ? u * group : u) * hd * 4;
  const kvHead = (u: number) => (one ? u : Math.floor(u / group));
  // rows of a unit cut so that a batch gives every thread a few calls
  const perUnit = Math.max(1, Math.ceil(piecesFor(arena.threads, 2 * batch * rows * l4 * hd) / batch));
  const rowStep = Math.ceil(rows / perUnit);
  // the kernel takes rows and inputs in fours; odd head sizes (and hosts without SIMD) run in JS,
  // as do sliding-window layers once the window hides early keys (the kernel has no lower bound)
  const windowed = window > 0 && pos + nTokens > window;
  const kernel = hd % 4 === 0 && arena.attn !== null && !windowed;
  for (let u0 = 0; u0 < units; u0 += batch) {
    const calls: KernelCall[] = [];
    for (let u = u0; u < Math.min(units, u0 + batch); u++) {
      const sc = scores + (u - u0) * rows * l4 * 4; // [rows × l4] of unit u
      for (let r0 = 0; r0 < rows; r0 += rowStep) {
        const n = Math.min(rowStep, rows - r0);
        const at = unitOffset(u) + r0 * stride;
        // these rows see keys below pos + r0 + n at most (a chunk's early rows skip the later keys)
        const keys = one ? l4 : Math.ceil((pos + r0 + n) / 4) * 4;
        const args = [q + at, stride, kv.keys(l, kvHead(u)), kv.values(l, kvHead(u)), kv.capacity, hd, keys, n, pos + 1 + r0 * step, step, scaleBits, out + at, stride, sc + r0 * l4 * 4];
        calls.push({ fn: KERNEL_IDS.attn, args });
      }
    }
    if (kernel) arena.run(calls);
    else for (const c of calls) attnJs(kv.arena, c.args, windowed ? window : 0);
  }
}

/**
 * `attn` (./wasm-attention.ts) in JS: the same products with the JS matmul, the softmax in f64
 * sums; with a window, row r sees only the last `window` of its keys (ops.attention's rule).
 */
function attnJs(arena: KvCache['arena'], a: number[], window: number): void {
  const [q, qs, k, v, cap, hd, l4, rows, first, step, scaleBits, out, os, sc] = a as [number, number, number, number, number, number, number, number, number, number, number, number, number, number];
  const scale = new Float32Array(Int32Array.of(scaleBits).buffer)[0]!;
  arena.mmF32Js(q, qs, k, hd * 4, sc, l4 * 4, hd, rows, 0, l4);
  causalSoftmax(arena.heap, sc >> 2, l4, rows, first, step, scale, window);
  arena.mmF32Js(sc, l4 * 4, v, cap * 4, out, os, l4, rows, 0, hd);
}

/**
 * Row r of the [nRows × width] scores at heap[at …] keeps keys lo ≤ j < first + r·step (lo = 0,
 * or the window's first key): scaled, softmaxed (ops.softmax), zero elsewhere.
 */
function causalSoftmax(heap: Float32Array, at: number, width: number, nRows: number, first: number, step: number, scale: number, window: number): void {
  for (let r = 0; r < nRows; r++) {
    const o = at + r * width;
    const n = first + r * step;
    const lo = window > 0 ? Math.max(0, n - window) : 0;
    for (let j = lo; j < n; j++) heap[o + j] = f32(heap[o + j]! * scale);
    softmax(heap, o + lo, n - lo);
    heap.fill(0, o, o + lo);
    heap.fill(0, o + n, o + width);
  }
}
