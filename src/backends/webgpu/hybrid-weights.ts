// A Qwen3.5 block's weights on the GPU (qwen35, qwen35moe; llama.cpp's src/models/qwen35moe.cpp):
// a Gated DeltaNet block (its own type here) or a gated full-attention block (the common
// LayerWeights with outputGate: q projection twice as wide, QK-norm), both with attn_norm, a
// post_attention_norm before the feed-forward and the common dense or MoE feed-forward. Here
// the block kind is chosen and the shard's blocks are walked whatever their kind.

import type { ModelConfig } from '../../model/config.ts';
import type { GpuExperts } from './experts.ts';
import { ffnExperts, ffnMatrices, ffnWeights, layerMatrices, layerVectors, uploadLayer } from './layer-weights.ts';
import type { DenseFfnWeights, LayerWeights, MoeFfnWeights, TensorUploader } from './layer-weights.ts';
import type { GpuMatrix } from './matrix.ts';

export interface GpuDeltaNetWeights {
  wqkv: GpuMatrix; // [convChannels rows × nEmbd] (attn_qkv: q | k | v)
  wz: GpuMatrix; // [nV·d rows × nEmbd] output gate (attn_gate)
  wAlpha: GpuMatrix; // [nV rows × nEmbd] (ssm_alpha)
  wBeta: GpuMatrix; // [nV rows × nEmbd] (ssm_beta)
  wOut: GpuMatrix; // [nEmbd rows × nV·d] (ssm_out)
  conv: GPUBuffer; // [convChannels × K] f32 (ssm_conv1d)
  dtBias: GPUBuffer; // [nV] f32 (ssm_dt.bias)
  a: GPUBuffer; // [nV] f32 −exp(A_log) (ssm_a)
  norm: GPUBuffer; // [d] f32 (ssm_norm)
}

export interface DeltaNetLayerWeights {
  kind: 'delta-net';
  attnNorm: GPUBuffer; // [nEmbd] f32
  net: GpuDeltaNetWeights;
  ffnNorm: GPUBuffer; // [nEmbd] f32 (post_attention_norm)
  ffn: DenseFfnWeights | MoeFfnWeights;
}

/** One block of any architecture we run on the GPU. */
export type BlockWeights = LayerWeights | DeltaNetLayerWeights;

export function isDeltaNet(l: BlockWeights): l is DeltaNetLayerWeights {
  return 'kind' in l && l.kind === 'delta-net';
}

/** Block `il` (global index): a Qwen3.5 block where the config is hybrid, else the common one. */
export function uploadBlock(t: TensorUploader, config: ModelConfig, il: number): BlockWeights {
  if (!config.linearAttention) return uploadLayer(t, config, il);
  const p = `blk.${il}.`;
  const attnNorm = t.vector(`${p}attn_norm.weight`);
  const ffnNorm = t.vector(`${p}post_attention_norm.weight`);
  const ffn = ffnWeights(t, config, p);
  if (config.recurrentLayers[il]) {
    const net: GpuDeltaNetWeights = {
      wqkv: t.matrix(`${p}attn_qkv.weight`),
      wz: t.matrix(`${p}attn_gate.weight`),
      wAlpha: t.matrix(`${p}ssm_alpha.weight`),
      wBeta: t.matrix(`${p}ssm_beta.weight`),
      wOut: t.matrix(`${p}ssm_out.weight`),
      conv: t.vector(`${p}ssm_conv1d.weight`),
      dtBias: t.vector(`${p}ssm_dt.bias`),
      a: t.vector(`${p}ssm_a`),
      norm: t.vector(`${p}ssm_norm.weight`),
    };
    return { kind: 'delta-net', attnNorm, net, ffnNorm, ffn };
  }
  return {
    attnNorm,
    wq: t.matrix(`${p}attn_q.weight`),
    wk: t.matrix(`${p}attn_k.weight`),
    wv: t.matrix(`${p}attn_v.weight`),
    wo: t.matrix(`${p}attn_output.weight`),
    qNorm: t.vector(`${p}attn_q_norm.weight`),
    kNorm: t.vector(`${p}attn_k_norm.weight`),
    ffnNorm,
    ffn,
    outputGate: true,
  };
}

/** Every matrix of the block (for pipelines and freeing). */
export function blockMatrices(l: BlockWeights): GpuMatrix[] {
  if (!isDeltaNet(l)) return layerMatrices(l);
  const w = l.net;
  return [w.wqkv, w.wz, w.wAlpha, w.wBeta, w.wOut, ...ffnMatrices(l.ffn)];
}

export function blockExperts(l: BlockWeights): GpuExperts[] {
  return ffnExperts(l.ffn);
}

export function blockVectors(l: BlockWeights): (GPUBuffer | undefined)[] {
  if (!isDeltaNet(l)) return layerVectors(l);
  const w = l.net;
  return [l.attnNorm, l.ffnNorm, w.conv, w.dtBias, w.a, w.norm];
}
