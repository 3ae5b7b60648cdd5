// The transformer forward pass of one shard on the CPU, for a batch of tokens at consecutive
// positions: the residual stream x goes through each layer's attention and feed-forward
// blocks, appending keys and values to the session's KV cache.

import type { ModelConfig } from '../../model/config.ts';
import type { KvCache } from './kv-cache.ts';
import { addBias, addInPlace, attention, rmsnorm, rope, swiglu } from './ops.ts';
import type { LayerWeights, Matrix, ShardWeights } from './weights.ts';

/** Per-call activation buffers for nTokens tokens. */
interface Scratch {
  xb: Float32Array; // [n × nEmbd] normed input of a block
  q: Float32Array; // [n × nHead·headDim]
  att: Float32Array; // [n × nHead·headDim] attention output before wo
  out: Float32Array; // [n × nEmbd] block output before the residual add
  gate: Float32Array; // [n × nFf]
  up: Float32Array; // [n × nFf]
  scores: Float32Array; // [nKeys] one head's attention weights
  ropeCache: Float32Array; // [nRot]
}

function scratchFor(cfg: ModelConfig, n: number, nKeys: number): Scratch {
  const qDim = cfg.nHead * cfg.headDim;
  return {
    xb: new Float32Array(n * cfg.nEmbd),
    q: new Float32Array(n * qDim),
    att: new Float32Array(n * qDim),
    out: new Float32Array(n * cfg.nEmbd),
    gate: new Float32Array(n * cfg.nFf),
    up: new Float32Array(n * cfg.nFf),
    scores: new Float32Array(nKeys),
    ropeCache: new Float32Array(cfg.rope.nRot),
  };
}

/** x = token embeddings of `tokens`. x: [n × nEmbd] */
export function embed(tokenEmbd: Matrix, tokens: Int32Array, nEmbd: number): Float32Array {
  const x = new Float32Array(tokens.length * nEmbd);
  for (let t = 0; t < tokens.length; t++) tokenEmbd.row(tokens[t]!, x, t * nEmbd);
  return x;
}

/**
 * Runs every layer of the shard over x (in place) for tokens at positions
 * [kv.length, kv.length + n), and advances the cache. x: [n × nEmbd]
 */
export function forwardLayers(cfg: ModelConfig, weights: ShardWeights, kv: KvCache, x: Float32Array, n: number): void {
  const pos = kv.length;
  kv.reserve(n);
  const s = scratchFor(cfg, n, pos + n);
  for (let l = 0; l < weights.layers.length; l++) {
    forwardLayer(cfg, weights.layers[l]!, kv, l, x, n, pos, s);
    kv.processedTokens[l]! += n;
  }
  kv.length = pos + n;
}

function forwardLayer(
  cfg: ModelConfig,
  w: LayerWeights,
  kv: KvCache,
  l: number,
  x: Float32Array,
  n: number,
  pos: number,
  s: Scratch,
): void {
  const { nEmbd, nHead, nHeadKv, headDim, rmsEps } = cfg;
  const kvDim = nHeadKv * headDim;
  // this batch's keys and values are written straight into the cache: [n × kvDim] each
  const k = kv.keys[l]!.subarray(pos * kvDim, (pos + n) * kvDim);
  const v = kv.values[l]!.subarray(pos * kvDim, (pos + n) * kvDim);

  // attention norm
  rmsnorm(s.xb, x, w.attnNorm, n, nEmbd, rmsEps);
  // q, k, v projections (+ biases for qwen2)
  w.wq.matmul(s.q, s.xb, n);
  w.wk.matmul(k, s.xb, n);
  w.wv.matmul(v, s.xb, n);
  if (w.bq) addBias(s.q, w.bq, n, nHead * headDim);
  if (w.bk) addBias(k, w.bk, n, kvDim);
  if (w.bv) addBias(v, w.bv, n, kvDim);
  // per-head RMSNorm of queries and keys (qwen3)
  if (w.qNorm) rmsnorm(s.q, s.q, w.qNorm, n * nHead, headDim, rmsEps);
  if (w.kNorm) rmsnorm(k, k, w.kNorm, n * nHeadKv, headDim, rmsEps);
  // rotary position embedding of queries and keys
  rope(s.q, n, nHead, headDim, pos, cfg.rope, s.ropeCache);
  rope(k, n, nHeadKv, headDim, pos, cfg.rope, s.ropeCache);
  // scores → causal softmax → weighted sum of values, over the cache
  attention(s.att, s.q, kv.keys[l]!, kv.values[l]!, n, pos, nHead, nHeadKv, headDim, s.scores);
  // output projection
  w.wo.matmul(s.out, s.att, n);
  // residual
  addInPlace(x, s.out);

  // feed-forward norm
  rmsnorm(s.xb, x, w.ffnNorm, n, nEmbd, rmsEps);
  // gate and up projections
  w.wGate.matmul(s.gate, s.xb, n);
  w.wUp.matmul(s.up, s.xb, n);
  // SwiGLU
  swiglu(s.gate, s.gate, s.up);
  // down projection
  w.wDown.matmul(s.out, s.gate, n);
  // residual
  addInPlace(x, s.out);
}

/** Logits of the last token: output norm, then the head. x: [n × nEmbd]; returns [nVocab] */
export function lastLogits(cfg: ModelConfig, weights: ShardWeights, x: Float32Array, n: number): Float32Array {
  const last = new Float32Array(cfg.nEmbd); // [nEmbd]
  rmsnorm(last, x.subarray((n - 1) * cfg.nEmbd, n * cfg.nEmbd), weights.outputNorm!, 1, cfg.nEmbd, cfg.rmsEps);
  const logits = new Float32Array(cfg.nVocab); // [nVocab]
  weights.output!.matmul(logits, last, 1);
  return logits;
}
