// A shard's weights on the GPU: every matrix stored as the GGUF's own blocks (split by rows
// where it exceeds a storage binding), every norm weight and bias dequantised to f32. Built
// from the tensors the page or Node read from the artifact, freed as one unit.

import { MeshError } from '../../errors.ts';
import { dequantize } from '../../gguf/dequant.ts';
import type { GgmlType } from '../../gguf/types.ts';
import type { ModelConfig } from '../../model/config.ts';
import type { ShardRange } from '../types.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { destroyMatrix, uploadMatrix } from './matrix.ts';
import type { GpuMatrix } from './matrix.ts';

/** One tensor of the shard as read from the artifact. */
export interface StageTensor {
  name: string;
  type: GgmlType;
  /** ggml order: shape[0] is the row length */
  shape: number[];
  bytes: Uint8Array;
}

export interface StageModel {
  config: ModelConfig;
  shard: ShardRange;
  /** where the shard came from, for error messages ("model.gguf") */
  artifact: string;
  tensors: StageTensor[];
}

export interface LayerWeights {
  attnNorm: GPUBuffer; // [nEmbd] f32
  wq: GpuMatrix; // [nHead·headDim rows × nEmbd]
  wk: GpuMatrix; // [nHeadKv·headDim rows × nEmbd]
  wv: GpuMatrix;
  wo: GpuMatrix; // [nEmbd rows × nHead·headDim]
  bq?: GPUBuffer; // [nHead·headDim] f32 (qwen2)
  bk?: GPUBuffer; // [nHeadKv·headDim]
  bv?: GPUBuffer;
  qNorm?: GPUBuffer; // [headDim] f32 (qwen3)
  kNorm?: GPUBuffer;
  ffnNorm: GPUBuffer; // [nEmbd] f32
  wGate: GpuMatrix; // [nFf rows × nEmbd]
  wUp: GpuMatrix;
  wDown: GpuMatrix; // [nEmbd rows × nFf]
}

export interface ShardWeights {
  config: ModelConfig;
  shard: ShardRange;
  artifact: string;
  tokenEmbd?: GpuMatrix; // [nVocab rows × nEmbd]
  layers: LayerWeights[];
  outputNorm?: GPUBuffer; // [nEmbd] f32
  output?: GpuMatrix; // [nVocab rows × nEmbd]
}

/** "shard [start, end) of artifact", for error messages. */
export function shardLabel(m: { shard: ShardRange; artifact: string }): string {
  return `shard [${m.shard.start}, ${m.shard.end}) of ${m.artifact}`;
}

/**
 * Uploads the shard's tensors: the embedding when it starts at layer 0, its layers, and the
 * output norm and head (the embedding again when tied) when it ends at the last layer. On a
 * failure the buffers made so far stay in `memory` for the caller to free.
 */
export function uploadShardWeights(memory: GpuMemory, model: StageModel, maxChunkBytes: number): ShardWeights {
  const { config, shard } = model;
  const byName = new Map(model.tensors.map((t) => [t.name, t]));
  const where = shardLabel(model);
  const need = (name: string): StageTensor => {
    const t = byName.get(name);
    if (!t) throw new MeshError('TENSOR_MISSING', `${where} needs ${name}, which was not given`);
    return t;
  };
  const matrix = (name: string): GpuMatrix => {
    const t = need(name);
    return uploadMatrix(memory, name, t.type, t.shape, t.bytes, maxChunkBytes);
  };
  const vector = (name: string): GPUBuffer => {
    const t = need(name);
    const n = t.shape.reduce((a, b) => a * b, 1);
    return memory.upload(name, dequantize(t.type, t.bytes, n));
  };
  const optionalVector = (name: string): GPUBuffer | undefined => (byName.has(name) ? vector(name) : undefined);

  const weights: ShardWeights = { config, shard: { ...shard }, artifact: model.artifact, layers: [] };
  if (shard.start === 0) weights.tokenEmbd = matrix('token_embd.weight');
  for (let l = shard.start; l < shard.end; l++) {
    const p = `blk.${l}.`;
    weights.layers.push({
      attnNorm: vector(`${p}attn_norm.weight`),
      wq: matrix(`${p}attn_q.weight`),
      wk: matrix(`${p}attn_k.weight`),
      wv: matrix(`${p}attn_v.weight`),
      wo: matrix(`${p}attn_output.weight`),
      bq: optionalVector(`${p}attn_q.bias`),
      bk: optionalVector(`${p}attn_k.bias`),
      bv: optionalVector(`${p}attn_v.bias`),
      qNorm: optionalVector(`${p}attn_q_norm.weight`),
      kNorm: optionalVector(`${p}attn_k_norm.weight`),
      ffnNorm: vector(`${p}ffn_norm.weight`),
      wGate: matrix(`${p}ffn_gate.weight`),
      wUp: matrix(`${p}ffn_up.weight`),
      wDown: matrix(`${p}ffn_down.weight`),
    });
  }
  if (shard.end === config.nLayer) {
    weights.outputNorm = vector('output_norm.weight');
    weights.output = byName.has('output.weight') ? matrix('output.weight') : (weights.tokenEmbd ?? matrix('token_embd.weight'));
  }
  return weights;
}

/** Every matrix a forward multiplies by: the layers' projections and the head. */
export function shardMatrices(w: ShardWeights): GpuMatrix[] {
  const out = w.layers.flatMap((l) => [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown]);
  if (w.output) out.push(w.output);
  return out;
}

export function destroyShardWeights(memory: GpuMemory, w: ShardWeights): void {
  if (w.output !== w.tokenEmbd) destroyMatrix(memory, w.output);
  destroyMatrix(memory, w.tokenEmbd);
  memory.destroy(w.outputNorm);
  for (const l of w.layers) {
    for (const mat of [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown]) destroyMatrix(memory, mat);
    for (const v of [l.attnNorm, l.ffnNorm, l.bq, l.bk, l.bv, l.qNorm, l.kNorm]) memory.destroy(v);
  }
}
