// One Qwen3.5 block (qwen35, qwen35moe) on the CPU, as llama.cpp's src/models/qwen35moe.cpp
// builds it: attn_norm → token mixer → residual → post_attention_norm → feed-forward →
// residual. The mixer is a Gated DeltaNet (linear attention with a recurrent state) on most
// blocks and gated full attention (a sigmoid gate from the q projection's second half, partial
// NeoX rope, QK-norm) on every full_attention_interval-th; the feed-forward is dense (qwen35)
// or experts plus a sigmoid-gated shared expert (qwen35moe).

import { ropeFor } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { deltaStep } from './delta-chunk.ts';
import { denseFfn, moeFfn } from './ffn.ts';
import type { DenseFfn, MoeFfn } from './ffn.ts';
import type { KvCache } from './kv-cache.ts';
import { loadFfn } from './layer-weights.ts';
import type { TensorLoader } from './layer-weights.ts';
import type { Matrix } from './matrix.ts';
import { addInPlace, attention, rmsnorm, rope, silu } from './ops.ts';

const f32 = Math.fround;

export interface DeltaNetWeights {
  kind: 'delta-net';
  wqkv: Matrix; // [convChannels × nEmbd] (attn_qkv: q | k | v)
  wz: Matrix; // [nV·d × nEmbd] output gate (attn_gate)
  conv: Float32Array; // [convChannels × K] (ssm_conv1d)
  dtBias: Float32Array; // [nV] (ssm_dt.bias)
  a: Float32Array; // [nV] −exp(A_log) (ssm_a)
  wBeta: Matrix; // [nV × nEmbd] (ssm_beta)
  wAlpha: Matrix; // [nV × nEmbd] (ssm_alpha)
  norm: Float32Array; // [d] (ssm_norm)
  wOut: Matrix; // [nEmbd × nV·d] (ssm_out)
}

export interface GatedAttentionWeights {
  kind: 'gated-attention';
  wq: Matrix; // [nHead·2·headDim × nEmbd]: per head, query then gate
  wk: Matrix; // [nHeadKv·headDim × nEmbd]
  wv: Matrix; // [nHeadKv·headDim × nEmbd]
  wo: Matrix; // [nEmbd × nHead·headDim]
  qNorm: Float32Array; // [headDim]
  kNorm: Float32Array; // [headDim]
}

export interface HybridLayerWeights {
  kind: 'hybrid';
  attnNorm: Float32Array; // [nEmbd]
  mixer: DeltaNetWeights | GatedAttentionWeights;
  ffnNorm: Float32Array; // [nEmbd] (post_attention_norm)
  ffn: DenseFfn | MoeFfn;
}

/** Block `il`'s weights (the feed-forward loaded as the other architectures' is). */
export function loadHybridLayer(t: TensorLoader, config: ModelConfig, il: number): HybridLayerWeights {
  const { nEmbd, headDim } = config;
  const p = `blk.${il}.`;
  let mixer: HybridLayerWeights['mixer'];
  if (config.recurrentLayers[il]) {
    const la = config.linearAttention!;
    const vDim = la.nVHeads * la.headDim;
    mixer = {
      kind: 'delta-net',
      wqkv: t.matrix(`${p}attn_qkv.weight`, nEmbd, la.convChannels),
      wz: t.matrix(`${p}attn_gate.weight`, nEmbd, vDim),
      conv: t.vector(`${p}ssm_conv1d.weight`, la.convChannels * la.convKernel),
      dtBias: t.vector(`${p}ssm_dt.bias`, la.nVHeads),
      a: t.vector(`${p}ssm_a`, la.nVHeads),
      wBeta: t.matrix(`${p}ssm_beta.weight`, nEmbd, la.nVHeads),
      wAlpha: t.matrix(`${p}ssm_alpha.weight`, nEmbd, la.nVHeads),
      norm: t.vector(`${p}ssm_norm.weight`, la.headDim),
      wOut: t.matrix(`${p}ssm_out.weight`, vDim, nEmbd),
    };
  } else {
    const qDim = config.nHead * headDim;
    const kvDim = config.nHeadKv * headDim;
    mixer = {
      kind: 'gated-attention',
      wq: t.matrix(`${p}attn_q.weight`, nEmbd, 2 * qDim),
      wk: t.matrix(`${p}attn_k.weight`, nEmbd, kvDim),
      wv: t.matrix(`${p}attn_v.weight`, nEmbd, kvDim),
      wo: t.matrix(`${p}attn_output.weight`, qDim, nEmbd),
      qNorm: t.vector(`${p}attn_q_norm.weight`, headDim),
      kNorm: t.vector(`${p}attn_k_norm.weight`, headDim),
    };
  }
  return { kind: 'hybrid', attnNorm: t.vector(`${p}attn_norm.weight`, nEmbd), mixer, ffnNorm: t.vector(`${p}post_attention_norm.weight`, nEmbd), ffn: loadFfn(t, config, il) };
}

/**
 * Runs block `il` (shard layer l) over x [n × nEmbd] in place at positions [pos, pos + n):
 * a DeltaNet block advances the session's recurrent state, an attention block its KV cache.
 */
export function forwardHybridLayer(cfg: ModelConfig, w: HybridLayerWeights, kv: KvCache, l: number, il: number, x: Float32Array, n: number, pos: number): void {
  const { nEmbd, rmsEps } = cfg;
  const xb = new Float32Array(n * nEmbd); // [n × nEmbd] normed input
  const out = new Float32Array(n * nEmbd); // [n × nEmbd] block output before the residual
  // attention norm → token mixer → residual
  rmsnorm(xb, x, w.attnNorm, n, nEmbd, rmsEps);
  if (w.mixer.kind === 'delta-net') deltaNetMixer(cfg, w.mixer, kv, l, xb, out, n);
  else gatedAttention(cfg, w.mixer, kv, l, il, xb, out, n, pos);
  addInPlace(x, out);
  // post-attention norm → dense or mixture-of-experts feed-forward → residual
  rmsnorm(xb, x, w.ffnNorm, n, nEmbd, rmsEps);
  if (w.ffn.kind === 'moe') moeFfn(w.ffn, cfg.moe!, cfg.ffnActivation, out, xb, n);
  else denseFfn(w.ffn, cfg.ffnActivation, out, xb, n);
  addInPlace(x, out);
}

/** Gated full attention: out = wo · (attention(rope(norm(q)), rope(norm(k)), v) ⊙ sigmoid(gate)). */
function gatedAttention(cfg: ModelConfig, w: GatedAttentionWeights, kv: KvCache, l: number, il: number, xb: Float32Array, out: Float32Array, n: number, pos: number): void {
  const { nHead, nHeadKv, headDim, rmsEps } = cfg;
  const qDim = nHead * headDim;
  const kvDim = nHeadKv * headDim;
  // the q projection holds, per head, the query and then its gate: [n × nHead × 2 × headDim]
  const qg = new Float32Array(n * 2 * qDim);
  w.wq.matmul(qg, xb, n);
  const q = new Float32Array(n * qDim); // [n × nHead × headDim]
  const gate = new Float32Array(n * qDim);
  for (let r = 0; r < n * nHead; r++) {
    q.set(qg.subarray(2 * r * headDim, (2 * r + 1) * headDim), r * headDim);
    gate.set(qg.subarray((2 * r + 1) * headDim, (2 * r + 2) * headDim), r * headDim);
  }
  // keys and values straight into the cache
  const k = kv.keys[l]!.subarray(pos * kvDim, (pos + n) * kvDim);
  const v = kv.values[l]!.subarray(pos * kvDim, (pos + n) * kvDim);
  w.wk.matmul(k, xb, n);
  w.wv.matmul(v, xb, n);
  // per-head RMSNorm of q and k, then the partial NeoX rope (text positions in every section)
  rmsnorm(q, q, w.qNorm, n * nHead, headDim, rmsEps);
  rmsnorm(k, k, w.kNorm, n * nHeadKv, headDim, rmsEps);
  const ropeCfg = ropeFor(cfg, il, kv.contextLength);
  rope(q, n, nHead, headDim, pos, ropeCfg);
  rope(k, n, nHeadKv, headDim, pos, ropeCfg);
  // causal softmax attention over the cache, gated by sigmoid(gate), then the output projection
  const att = new Float32Array(n * qDim);
  attention(att, q, kv.keys[l]!, kv.values[l]!, n, pos, nHead, nHeadKv, headDim);
  for (let i = 0; i < att.length; i++) att[i] = f32(att[i]! * sigmoid(gate[i]!));
  w.wo.matmul(out, att, n);
}

function sigmoid(x: number): number {
  return f32(1 / f32(1 + f32(Math.exp(-x))));
}

function softplus(x: number): number {
  return x > 20 ? x : f32(Math.log(f32(1 + f32(Math.exp(x)))));
}

/**
 * Gated DeltaNet: qkv projection → causal conv (over carried rows) → SiLU → L2-norm of q, k →
 * the chunked delta rule over the session's state, token by token with the same arithmetic
 * for a prefill and a decode (./delta-chunk.ts) → RMSNorm per head gated by SiLU(z) → ssm_out.
 */
function deltaNetMixer(cfg: ModelConfig, w: DeltaNetWeights, kv: KvCache, l: number, xb: Float32Array, out: Float32Array, n: number): void {
  const la = cfg.linearAttention!;
  const { nVHeads: nV, headDim: d, convChannels: ch } = la;
  const rec = kv.recurrent!;
  const state = rec.layer(l);
  const beforeFold = rec.beforeFold(l);
  // projections: q|k|v mix [n × ch], output gate z [n × nV·d], β and α [n × nV]
  const mixed = new Float32Array(n * ch);
  w.wqkv.matmul(mixed, xb, n);
  const z = new Float32Array(n * nV * d);
  w.wz.matmul(z, xb, n);
  const beta = new Float32Array(n * nV);
  w.wBeta.matmul(beta, xb, n);
  const g = new Float32Array(n * nV);
  w.wAlpha.matmul(g, xb, n);
  for (let i = 0; i < n * nV; i++) {
    beta[i] = sigmoid(beta[i]!);
    // log-decay: softplus(α + dt_bias) · ssm_a
    g[i] = f32(softplus(f32(g[i]! + w.dtBias[i % nV]!)) * w.a[i % nV]!);
  }
  // conv, norms and the delta rule, token by token: o [n × nV × d]
  const o = new Float32Array(n * nV * d);
  for (let t = 0; t < n; t++) {
    const inputs = { mixed: mixed.subarray(t * ch, (t + 1) * ch), g: g.subarray(t * nV, (t + 1) * nV), beta: beta.subarray(t * nV, (t + 1) * nV) };
    deltaStep(state, w.conv, inputs, o.subarray(t * nV * d, (t + 1) * nV * d), cfg.rmsEps, beforeFold);
  }
  // RMSNorm per head, gated by SiLU(z), and the output projection
  rmsnorm(o, o, w.norm, n * nV, d, cfg.rmsEps);
  for (let i = 0; i < o.length; i++) o[i] = f32(o[i]! * silu(z[i]!));
  w.wOut.matmul(out, o, n);
}
