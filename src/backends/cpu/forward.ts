// The transformer forward pass of one shard on the CPU, for a batch of tokens at consecutive
// positions: the residual stream x goes through each layer's attention and feed-forward
// blocks, appending keys and values to the session's KV cache. Activations live in the
// engine's WasmArena, so the kernels read and write them in place.

import { ropeFor } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { attendCached, attentionScratchBytes } from './attention.ts';
import { swigluInArena } from './arena-ops.ts';
import { moeFfn } from './ffn.ts';
import type { DenseFfn, MoeFfn } from './ffn.ts';
import { geglu } from './gelu.ts';
import { hybridMixer } from './hybrid-layer.ts';
import type { HybridLayerWeights } from './hybrid-layer.ts';
import type { KvCache } from './kv-cache.ts';
import { addBias, addInPlace, rmsnorm, rope, scaleInPlace } from './ops.ts';
import type { WasmArena } from './wasm-arena.ts';
import type { LayerWeights, Matrix, ShardWeights } from './weights.ts';

/** Per-call activation buffers for nTokens tokens: views into the arena, and their byte offsets. */
export interface Scratch {
  xb: Float32Array; // [n × nEmbd] normed input of a block
  q: Float32Array; // [n × nHead·headDim]
  k: Float32Array; // [n × nHeadKv·headDim] this batch's keys, before they enter the cache
  v: Float32Array; // [n × nHeadKv·headDim]
  att: Float32Array; // [n × nHead·headDim] attention output before wo
  out: Float32Array; // [n × nEmbd] block output before the residual add
  gate: Float32Array; // [n × nFf] (dense feed-forward layers)
  up: Float32Array; // [n × nFf]
  /** byte offset of the attention scores scratch (attentionScratchBytes) */
  scores: number;
  ropeCache: Float32Array; // [nRot]
  /** the arena region holding all of the above */
  region: number;
}

/** rows of the widest dense feed-forward among the shard's layers (0 when all are experts) */
function denseFfRows(weights: ShardWeights): number {
  return Math.max(0, ...weights.layers.map((w) => (w.ffn.kind === 'dense' ? w.ffn.wGate.rows : 0)));
}

/**
 * Reserves everything a forward of n tokens needs from the arena before taking views (growing an
 * unshared memory detaches older views): the kernels' staging, then one region for the scratch
 * (with `scoresBytes` of attention scores: ./attention.ts attentionScratchBytes).
 */
export function scratchFor(cfg: ModelConfig, weights: ShardWeights, arena: WasmArena, n: number, scoresBytes: number): Scratch {
  const qDim = cfg.nHead * cfg.headDim;
  const kvDim = cfg.nHeadKv * cfg.headDim;
  const nFf = denseFfRows(weights);
  // the matmuls' staging (a rounded copy of x, its Q8_0 form, a dequantised tile)
  arena.staging(weights.staging(n));
  const sizes = { xb: n * cfg.nEmbd, q: n * qDim, k: n * kvDim, v: n * kvDim, att: n * qDim, out: n * cfg.nEmbd, gate: n * nFf, up: n * nFf };
  const floats = Object.values(sizes).reduce((a, b) => a + Math.ceil(b / 4) * 4, 0);
  const region = arena.alloc(floats * 4 + scoresBytes);
  let at = region;
  const take = (len: number): Float32Array => {
    const view = arena.f32(at, len);
    at += Math.ceil(len / 4) * 16;
    return view;
  };
  const views = Object.fromEntries(Object.entries(sizes).map(([k, len]) => [k, take(len)])) as Record<keyof typeof sizes, Float32Array>;
  return { ...views, scores: at, ropeCache: new Float32Array(cfg.rope.nRot), region };
}

/** x = token embeddings of `tokens` (times the model's embedding scale). x: [n × nEmbd] */
export function embed(tokenEmbd: Matrix, tokens: Int32Array, nEmbd: number, scale = 1): Float32Array {
  const x = new Float32Array(tokens.length * nEmbd);
  for (let t = 0; t < tokens.length; t++) tokenEmbd.row(tokens[t]!, x, t * nEmbd);
  if (scale !== 1) scaleInPlace(x, scale);
  return x;
}

/**
 * Tokens run through the layers together at most: a longer input goes through in batches of this
 * (each sees the keys of the ones before, so the result is the same bit for bit), which bounds
 * the activations' memory while a batch this big still keeps every kernel busy.
 */
export const MAX_BATCH = 128;

/**
 * Runs every layer of the shard over x (in place) for tokens at positions
 * [kv.length, kv.length + n), and advances the cache. x: [n × nEmbd]
 */
export function forwardLayers(cfg: ModelConfig, weights: ShardWeights, kv: KvCache, x: Float32Array, n: number): void {
  // once per forward, not per batch: a rewind to where the forward started stays possible
  kv.recurrent?.beginForward(kv.length);
  for (let t0 = 0; t0 < n; t0 += MAX_BATCH) {
    const m = Math.min(MAX_BATCH, n - t0);
    forwardChunk(cfg, weights, kv, x.subarray(t0 * cfg.nEmbd, (t0 + m) * cfg.nEmbd), m);
  }
}

/**
 * Where a forward's rows sit in the sessions: n consecutive positions of one session (here), or
 * one position each of several sessions (./batch-forward.ts). It rotates queries and keys by
 * their positions, puts the keys and values into their caches and attends: s.att from s.q.
 */
export interface RowPlacement {
  attend(cfg: ModelConfig, l: number, il: number, s: Scratch): void;
}

/** n consecutive positions of one session from `pos` */
function sessionRows(kv: KvCache, pos: number, n: number): RowPlacement {
  return {
    attend(cfg, l, il, s) {
      const { nHead, nHeadKv, headDim } = cfg;
      // rotary position embedding of queries and keys (the layer's settings: sliding-window layers
      // and long Phi-3 sessions have their own)
      const ropeCfg = ropeFor(cfg, il, kv.contextLength);
      rope(s.q, n, nHead, headDim, pos, ropeCfg, s.ropeCache);
      rope(s.k, n, nHeadKv, headDim, pos, ropeCfg, s.ropeCache);
      // gemma3, phi3: queries scaled before attention, scores not scaled again
      if (cfg.queryScale !== null) scaleInPlace(s.q, cfg.queryScale);
      // keys and values join the cache; scores → causal (sliding-window) softmax → weighted sum of
      // values, over it
      kv.write(l, pos, s.k, s.v, n);
      const window = cfg.swaLayers[il] ? cfg.slidingWindow : 0;
      attendCached(kv, l, cfg, s.q.byteOffset, s.att.byteOffset, n, pos, s.scores, cfg.queryScale === null ? undefined : 1, window);
    },
  };
}

function forwardChunk(cfg: ModelConfig, weights: ShardWeights, kv: KvCache, x: Float32Array, n: number): void {
  const pos = kv.length;
  kv.reserve(n);
  const s = scratchFor(cfg, weights, kv.arena, n, attentionScratchBytes(cfg, n, pos));
  const rows = sessionRows(kv, pos, n);
  try {
    for (let l = 0; l < weights.layers.length; l++) {
      const w = weights.layers[l]!;
      // Qwen3.5 blocks (Gated DeltaNet or gated attention) have their own token mixer
      if ('mixer' in w) forwardHybridLayer(cfg, w, kv, l, weights.layerStart + l, x, n, pos, s);
      else forwardLayer(cfg, w, rows, kv.arena, l, weights.layerStart + l, x, n, s);
      kv.processedTokens[l]! += n;
    }
  } finally {
    kv.arena.free(s.region);
  }
  kv.length = pos + n;
}

/** One (attention) layer over the n rows of x, in place; `rows` says whose positions they are. */
export function forwardLayer(cfg: ModelConfig, w: LayerWeights, rows: RowPlacement, arena: WasmArena, l: number, il: number, x: Float32Array, n: number, s: Scratch): void {
  const { nEmbd, nHead, nHeadKv, headDim, rmsEps } = cfg;
  const kvDim = nHeadKv * headDim;
  const { k, v } = s;

  // attention norm
  rmsnorm(s.xb, x, w.attnNorm, n, nEmbd, rmsEps);
  // q, k, v projections (+ biases for qwen2)
  w.wq.matmul(s.q, s.xb, n);
  w.wk.matmul(k, s.xb, n);
  w.wv.matmul(v, s.xb, n);
  if (w.bq) addBias(s.q, w.bq, n, nHead * headDim);
  if (w.bk) addBias(k, w.bk, n, kvDim);
  if (w.bv) addBias(v, w.bv, n, kvDim);
  // per-head RMSNorm of queries and keys (qwen3, gemma3)
  if (w.qNorm) rmsnorm(s.q, s.q, w.qNorm, n * nHead, headDim, rmsEps);
  if (w.kNorm) rmsnorm(k, k, w.kNorm, n * nHeadKv, headDim, rmsEps);
  rows.attend(cfg, l, il, s);
  // output projection (and its post-norm, gemma3)
  w.wo.matmul(s.out, s.att, n);
  if (w.attnPostNorm) rmsnorm(s.out, s.out, w.attnPostNorm, n, nEmbd, rmsEps);
  // residual
  addInPlace(x, s.out);

  // feed-forward norm, feed-forward
  rmsnorm(s.xb, x, w.ffnNorm, n, nEmbd, rmsEps);
  feedForward(cfg, w.ffn, arena, n, s);
  // post-norm (gemma3)
  if (w.ffnPostNorm) rmsnorm(s.out, s.out, w.ffnPostNorm, n, nEmbd, rmsEps);
  // residual
  addInPlace(x, s.out);
}

/**
 * A Qwen3.5 block: attn_norm → token mixer (Gated DeltaNet or gated attention, ./hybrid-layer.ts)
 * → residual → post_attention_norm → feed-forward → residual.
 */
function forwardHybridLayer(cfg: ModelConfig, w: HybridLayerWeights, kv: KvCache, l: number, il: number, x: Float32Array, n: number, pos: number, s: Scratch): void {
  rmsnorm(s.xb, x, w.attnNorm, n, cfg.nEmbd, cfg.rmsEps);
  hybridMixer(cfg, w.mixer, kv, l, il, n, pos, s);
  addInPlace(x, s.out);
  rmsnorm(s.xb, x, w.ffnNorm, n, cfg.nEmbd, cfg.rmsEps);
  feedForward(cfg, w.ffn, kv.arena, n, s);
  addInPlace(x, s.out);
}

/** s.out = the feed-forward of s.xb: dense, or a mixture of experts (only the routed experts' matrices are read). */
function feedForward(cfg: ModelConfig, ffn: DenseFfn | MoeFfn, arena: WasmArena, n: number, s: Scratch): void {
  if (ffn.kind === 'moe') {
    moeFfn(ffn, cfg.moe!, cfg.ffnActivation, s.out, s.xb, n);
    return;
  }
  // gate and up projections, SwiGLU (on the arena's threads) or GeGLU, down projection
  const rows = ffn.wGate.rows;
  const gate = s.gate.subarray(0, n * rows);
  const up = s.up.subarray(0, n * rows);
  ffn.wGate.matmul(gate, s.xb, n);
  ffn.wUp.matmul(up, s.xb, n);
  if (cfg.ffnActivation === 'gelu') geglu(gate, gate, up);
  else if (rows % 4 === 0) swigluInArena(arena, gate, up);
  // the kernel takes fours and JS the rest: row by row, so a row's result does not depend on its batch
  else for (let t = 0; t < n; t++) swigluInArena(arena, gate.subarray(t * rows, (t + 1) * rows), up.subarray(t * rows, (t + 1) * rows));
  ffn.wDown.matmul(s.out, gate, n);
}

/** Logits of the last token: output norm, then the head. x: [n × nEmbd]; returns [nVocab] */
export function lastLogits(cfg: ModelConfig, weights: ShardWeights, x: Float32Array, n: number): Float32Array {
  return rowLogits(cfg, weights, x.subarray((n - 1) * cfg.nEmbd, n * cfg.nEmbd), 1)[0]!;
}

/** Logits of each row of x (the output norm, then the head over all B rows at once): B arrays of [nVocab]. x: [B × nEmbd] */
export function rowLogits(cfg: ModelConfig, weights: ShardWeights, x: Float32Array, B: number): Float32Array[] {
  const normed = new Float32Array(B * cfg.nEmbd);
  rmsnorm(normed, x, weights.outputNorm!, B, cfg.nEmbd, cfg.rmsEps);
  const logits = new Float32Array(B * cfg.nVocab); // [B × nVocab]
  weights.output!.matmul(logits, normed, B);
  const c = cfg.finalLogitSoftcap;
  // gemma: logits = c · tanh(logits / c)
  if (c > 0) for (let i = 0; i < logits.length; i++) logits[i] = Math.fround(Math.fround(Math.tanh(Math.fround(logits[i]! * Math.fround(1 / c)))) * c);
  if (B === 1) return [logits];
  return Array.from({ length: B }, (_, i) => logits.slice(i * cfg.nVocab, (i + 1) * cfg.nVocab));
}
