// One transformer block's weights on the GPU, for every architecture we run: separate or fused
// (phi3) q/k/v — a fused tensor is uploaded as three row ranges, each its own matrix — biases,
// q/k norms, Gemma 3's post-norms, and a dense feed-forward (phi3's fused gate/up split the
// same way) or a mixture of experts (router, 3-D expert tensors, qwen2moe's shared expert).

import { MeshError } from '../../errors.ts';
import type { ModelConfig } from '../../model/config.ts';
import type { GpuExperts } from './experts.ts';
import type { GpuMatrix } from './matrix.ts';

export interface DenseFfnWeights {
  kind: 'dense';
  wGate: GpuMatrix; // [nFf rows × nEmbd]
  wUp: GpuMatrix;
  wDown: GpuMatrix; // [nEmbd rows × nFf]
}

export interface MoeFfnWeights {
  kind: 'moe';
  router: GpuMatrix; // [nExpert rows × nEmbd] (ffn_gate_inp)
  gate: GpuExperts; // nExpert × [nFfExp rows × nEmbd]
  up: GpuExperts;
  down: GpuExperts; // nExpert × [nEmbd rows × nFfExp]
  /** qwen2moe: the shared expert and its gate, a 1-row matrix (ffn_gate_inp_shexp) */
  shared?: { gateInp: GpuMatrix; ffn: DenseFfnWeights };
}

export interface LayerWeights {
  attnNorm: GPUBuffer; // [nEmbd] f32
  wq: GpuMatrix; // [nHead·headDim rows × nEmbd]
  wk: GpuMatrix; // [nHeadKv·headDim rows × nEmbd]
  wv: GpuMatrix;
  wo: GpuMatrix; // [nEmbd rows × nHead·headDim]
  bq?: GPUBuffer; // [nHead·headDim] f32 (qwen2, or a fused bias's part)
  bk?: GPUBuffer; // [nHeadKv·headDim]
  bv?: GPUBuffer;
  qNorm?: GPUBuffer; // [headDim] f32 (qwen3, gemma3)
  kNorm?: GPUBuffer;
  attnPostNorm?: GPUBuffer; // [nEmbd] f32 (gemma3)
  ffnNorm: GPUBuffer; // [nEmbd] f32
  ffnPostNorm?: GPUBuffer; // [nEmbd] f32 (gemma3)
  ffn: DenseFfnWeights | MoeFfnWeights;
  /** Qwen3.5's gated attention: wq has 2·nHead·headDim rows (per head the query, then its sigmoid gate) */
  outputGate?: true;
}

/** How a layer's tensors are uploaded, by name (TENSOR_MISSING when absent). */
export interface TensorUploader {
  has(name: string): boolean;
  /** a 1-D tensor (or its elements [from, from + n)) as f32 */
  vector(name: string, from?: number, n?: number): GPUBuffer;
  /** rows [row0, row0 + rows) of a tensor with rows of its ne0 values (all rows when omitted) */
  matrix(name: string, row0?: number, rows?: number): GpuMatrix;
  /** a 3-D expert tensor */
  experts(name: string): GpuExperts;
}

/** Layer `il` (global index) of `config`. */
export function uploadLayer(t: TensorUploader, config: ModelConfig, il: number): LayerWeights {
  const p = `blk.${il}.`;
  const qDim = config.nHead * config.headDim;
  const kvDim = config.nHeadKv * config.headDim;
  const optional = (name: string) => (t.has(name) ? t.vector(name) : undefined);
  const fused = `${p}attn_qkv.weight`;
  const fusedBias = `${p}attn_qkv.bias`;
  const isFused = t.has(fused);
  const bias = (part: 'q' | 'k' | 'v', from: number, n: number) =>
    isFused ? (t.has(fusedBias) ? t.vector(fusedBias, from, n) : undefined) : optional(`${p}attn_${part}.bias`);
  return {
    attnNorm: t.vector(`${p}attn_norm.weight`),
    // phi3: one [nEmbd, qDim + 2·kvDim] projection, rows q | k | v
    wq: isFused ? t.matrix(fused, 0, qDim) : t.matrix(`${p}attn_q.weight`),
    wk: isFused ? t.matrix(fused, qDim, kvDim) : t.matrix(`${p}attn_k.weight`),
    wv: isFused ? t.matrix(fused, qDim + kvDim, kvDim) : t.matrix(`${p}attn_v.weight`),
    wo: t.matrix(`${p}attn_output.weight`),
    bq: bias('q', 0, qDim),
    bk: bias('k', qDim, kvDim),
    bv: bias('v', qDim + kvDim, kvDim),
    qNorm: optional(`${p}attn_q_norm.weight`),
    kNorm: optional(`${p}attn_k_norm.weight`),
    attnPostNorm: optional(`${p}post_attention_norm.weight`),
    ffnNorm: t.vector(`${p}ffn_norm.weight`),
    ffnPostNorm: optional(`${p}post_ffw_norm.weight`),
    ffn: ffnWeights(t, config, p),
  };
}

/** The block's dense feed-forward or mixture of experts; p: "blk.{il}." */
export function ffnWeights(t: TensorUploader, config: ModelConfig, p: string): DenseFfnWeights | MoeFfnWeights {
  return config.moe ? moeWeights(t, p, config.moe.nFfShared > 0, config.nFf) : denseWeights(t, p, '', config.nFf);
}

/** ffn_{gate,up,down}{suffix}; phi3 fuses gate and up into ffn_up (gate rows first). */
function denseWeights(t: TensorUploader, p: string, suffix: string, nFf: number): DenseFfnWeights {
  const gate = `${p}ffn_gate${suffix}.weight`;
  const up = `${p}ffn_up${suffix}.weight`;
  const fused = !t.has(gate);
  return {
    kind: 'dense',
    wGate: fused ? t.matrix(up, 0, nFf) : t.matrix(gate),
    wUp: fused ? t.matrix(up, nFf, nFf) : t.matrix(up),
    wDown: t.matrix(`${p}ffn_down${suffix}.weight`),
  };
}

function moeWeights(t: TensorUploader, p: string, shared: boolean, nFf: number): MoeFfnWeights {
  if (t.has(`${p}ffn_gate_up_exps.weight`)) {
    throw new MeshError('UNSUPPORTED_TENSOR_LAYOUT', `${p}ffn_gate_up_exps.weight (fused expert gate/up) is not supported`);
  }
  const w: MoeFfnWeights = {
    kind: 'moe',
    router: t.matrix(`${p}ffn_gate_inp.weight`),
    gate: t.experts(`${p}ffn_gate_exps.weight`),
    up: t.experts(`${p}ffn_up_exps.weight`),
    down: t.experts(`${p}ffn_down_exps.weight`),
  };
  if (shared) w.shared = { gateInp: t.matrix(`${p}ffn_gate_inp_shexp.weight`), ffn: denseWeights(t, p, '_shexp', nFf) };
  return w;
}

/** Every matrix of the layer (for pipelines and freeing). */
export function layerMatrices(l: LayerWeights): GpuMatrix[] {
  return [l.wq, l.wk, l.wv, l.wo, ...ffnMatrices(l.ffn)];
}

/** The feed-forward's matrices (router and shared expert included, experts not). */
export function ffnMatrices(f: DenseFfnWeights | MoeFfnWeights): GpuMatrix[] {
  const dense = (f: DenseFfnWeights) => [f.wGate, f.wUp, f.wDown];
  if (f.kind === 'dense') return dense(f);
  return f.shared ? [f.router, f.shared.gateInp, ...dense(f.shared.ffn)] : [f.router];
}

export function ffnExperts(f: DenseFfnWeights | MoeFfnWeights): GpuExperts[] {
  return f.kind === 'moe' ? [f.gate, f.up, f.down] : [];
}

export function layerVectors(l: LayerWeights): (GPUBuffer | undefined)[] {
  return [l.attnNorm, l.ffnNorm, l.bq, l.bk, l.bv, l.qNorm, l.kNorm, l.attnPostNorm, l.ffnPostNorm];
}
