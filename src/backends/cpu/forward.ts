// The transformer forward pass of one shard on the CPU, for a batch of tokens at consecutive
// positions: the residual stream x goes through each layer's attention and feed-forward
// blocks, appending keys and values to the session's KV cache.

import { ropeFor } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { denseFfn, moeFfn } from './ffn.ts';
import { forwardHybridLayer } from './hybrid-layer.ts';
import type { KvCache } from './kv-cache.ts';
import { addBias, addInPlace, attention, rmsnorm, rope, scaleInPlace } from './ops.ts';
import type { LayerWeights, Matrix, ShardWeights } from './weights.ts';

/** Per-call activation buffers for nTokens tokens. */
interface Scratch {
  xb: Float32Array; // [n × nEmbd] normed input of a block
  q: Float32Array; // [n × nHead·headDim]
  att: Float32Array; // [n × nHead·headDim] attention output before wo
  out: Float32Array; // [n × nEmbd] block output before the residual add
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
    scores: new Float32Array(nKeys),
    ropeCache: new Float32Array(cfg.rope.nRot),
  };
}

/** x = token embeddings of `tokens` (times the model's embedding scale). x: [n × nEmbd] */
export function embed(tokenEmbd: Matrix, tokens: Int32Array, nEmbd: number, scale = 1): Float32Array {
  const x = new Float32Array(tokens.length * nEmbd);
  for (let t = 0; t < tokens.length; t++) tokenEmbd.row(tokens[t]!, x, t * nEmbd);
  if (scale !== 1) scaleInPlace(x, scale);
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
  kv.recurrent?.beginForward(pos);
  for (let l = 0; l < weights.layers.length; l++) {
    const w = weights.layers[l]!;
    // Qwen3.5 blocks (Gated DeltaNet or gated attention) have their own layer function
    if ('mixer' in w) forwardHybridLayer(cfg, w, kv, l, weights.layerStart + l, x, n, pos);
    else forwardLayer(cfg, w, kv, l, weights.layerStart + l, x, n, pos, s);
    kv.processedTokens[l]! += n;
  }
  kv.length = pos + n;
}

function forwardLayer(
  cfg: ModelConfig,
  w: LayerWeights,
  kv: KvCache,
  l: number,
  il: number,
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
  // rotary position embedding of queries and keys (the layer's settings: sliding-window layers
  // and long Phi-3 sessions have their own)
  const ropeCfg = ropeFor(cfg, il, kv.contextLength);
  rope(s.q, n, nHead, headDim, pos, ropeCfg, s.ropeCache);
  rope(k, n, nHeadKv, headDim, pos, ropeCfg, s.ropeCache);
  // gemma3, phi3: queries scaled before attention, scores not scaled again
  if (cfg.queryScale !== null) scaleInPlace(s.q, cfg.queryScale);
  // scores → causal (sliding-window) softmax → weighted sum of values, over the cache
  const window = cfg.swaLayers[il] ? cfg.slidingWindow : 0;
  attention(s.att, s.q, kv.keys[l]!, kv.values[l]!, n, pos, nHead, nHeadKv, headDim, s.scores, cfg.queryScale === null ? undefined : 1, window);
  // output projection (and its post-norm, gemma3)
  w.wo.matmul(s.out, s.att, n);
  if (w.attnPostNorm) rmsnorm(s.out, s.out, w.attnPostNorm, n, nEmbd, rmsEps);
  // residual
  addInPlace(x, s.out);

  // feed-forward norm
  rmsnorm(s.xb, x, w.ffnNorm, n, nEmbd, rmsEps);
  // gated feed-forward (SwiGLU or GeGLU), or a mixture of experts; post-norm (gemma3)
  if (w.ffn.kind === 'moe') moeFfn(w.ffn, cfg.moe!, cfg.ffnActivation, s.out, s.xb, n);
  else denseFfn(w.ffn, cfg.ffnActivation, s.out, s.xb, n);
  if (w.ffnPostNorm) rmsnorm(s.out, s.out, w.ffnPostNorm, n, nEmbd, rmsEps);
  // residual
  addInPlace(x, s.out);
}

/** Logits of the last token: output norm, then the head. x: [n × nEmbd]; returns [nVocab] */
export function lastLogits(cfg: ModelConfig, weights: ShardWeights, x: Float32Array, n: number): Float32Array {
  const last = new Float32Array(cfg.nEmbd); // [nEmbd]
  rmsnorm(last, x.subarray((n - 1) * cfg.nEmbd, n * cfg.nEmbd), weights.outputNorm!, 1, cfg.nEmbd, cfg.rmsEps);
  const logits = new Float32Array(cfg.nVocab); // [nVocab]
  weights.output!.matmul(logits, last, 1);
  // gemma: logits = c · tanh(logits / c)
  const c = cfg.finalLogitSoftcap;
  if (c > 0) for (let i = 0; i < logits.length; i++) logits[i] = Math.fround(Math.fround(Math.tanh(Math.fround(logits[i]! * Math.fround(1 / c)))) * c);
  return logits;
}
