// A shard's weights on the GPU: every matrix stored as the GGUF's own blocks (split by rows
// where it exceeds a storage binding), every norm weight and bias dequantised to f32. Built
// from the tensors the page or Node read from the artifact, freed as one unit.

import { MeshError } from '../../errors.ts';
import { dequantize } from '../../gguf/dequant.ts';
import type { GgmlType } from '../../gguf/types.ts';
import type { ModelConfig } from '../../model/config.ts';
import type { ShardRange } from '../types.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { GELU_F16_TABLE } from '../cpu/gelu.ts';
import { destroyExperts, uploadExperts } from './experts.ts';
import type { GpuExperts } from './experts.ts';
import { blockExperts, blockMatrices, blockVectors, uploadBlock } from './hybrid-weights.ts';
import type { BlockWeights } from './hybrid-weights.ts';
import type { TensorUploader } from './layer-weights.ts';
import { destroyMatrix, uploadMatrix } from './matrix.ts';
import type { GpuMatrix } from './matrix.ts';

export type { LayerWeights } from './layer-weights.ts';
export type { BlockWeights } from './hybrid-weights.ts';

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

export interface ShardWeights {
  config: ModelConfig;
  shard: ShardRange;
  artifact: string;
  tokenEmbd?: GpuMatrix; // [nVocab rows × nEmbd]
  layers: BlockWeights[];
  outputNorm?: GPUBuffer; // [nEmbd] f32
  output?: GpuMatrix; // [nVocab rows × nEmbd]
  /** [65536] f32 GELU by f16 bit pattern, for GeGLU models (gemma3) */
  geluTable?: GPUBuffer;
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
  const elements = (t: StageTensor) => t.shape.reduce((a, b) => a * b, 1);
  const made = new Map<string, GpuMatrix>();
  const matrix = (name: string, row0 = 0, rows?: number): GpuMatrix => {
    const t = need(name);
    const k = t.shape[0]!;
    const all = elements(t) / k;
    const n = rows ?? all - row0;
    const label = row0 === 0 && n === all ? name : `${name}[${row0}..${row0 + n})`;
    const done = made.get(label);
    if (done) return done;
    const rowBytes = t.bytes.byteLength / all;
    const m = uploadMatrix(memory, label, t.type, [k, n], t.bytes.subarray(row0 * rowBytes, (row0 + n) * rowBytes), maxChunkBytes);
    made.set(label, m);
    return m;
  };
  const vector = (name: string, from = 0, n?: number): GPUBuffer => {
    const t = need(name);
    const all = dequantize(t.type, t.bytes, elements(t));
    return memory.upload(n === undefined && from === 0 ? name : `${name}[${from}..)`, all.subarray(from, n === undefined ? undefined : from + n));
  };
  const experts = (name: string): GpuExperts => {
    const t = need(name);
    return uploadExperts(memory, name, t.type, t.shape, t.bytes, maxChunkBytes);
  };
  const uploader: TensorUploader = { has: (name) => byName.has(name), vector, matrix, experts };

  const weights: ShardWeights = { config, shard: { ...shard }, artifact: model.artifact, layers: [] };
  if (shard.start === 0) weights.tokenEmbd = matrix('token_embd.weight');
  for (let l = shard.start; l < shard.end; l++) weights.layers.push(uploadBlock(uploader, config, l));
  if (config.ffnActivation === 'gelu') weights.geluTable = memory.upload('gelu f16 table', GELU_F16_TABLE);
  if (shard.end === config.nLayer) {
    weights.outputNorm = vector('output_norm.weight');
    weights.output = byName.has('output.weight') ? matrix('output.weight') : (weights.tokenEmbd ?? matrix('token_embd.weight'));
  }
  return weights;
}

/** Every matrix a forward multiplies by: the layers' projections and the head. */
export function shardMatrices(w: ShardWeights): GpuMatrix[] {
  const out = w.layers.flatMap(blockMatrices);
  if (w.output) out.push(w.output);
  return out;
}

/** Every expert tensor of the shard. */
export function shardExperts(w: ShardWeights): GpuExperts[] {
  return w.layers.flatMap(blockExperts);
}

export function destroyShardWeights(memory: GpuMemory, w: ShardWeights): void {
  if (w.output !== w.tokenEmbd) destroyMatrix(memory, w.output);
  destroyMatrix(memory, w.tokenEmbd);
  memory.destroy(w.outputNorm);
  memory.destroy(w.geluTable);
  for (const l of w.layers) {
    for (const mat of blockMatrices(l)) destroyMatrix(memory, mat);
    for (const e of blockExperts(l)) destroyExperts(memory, e);
    for (const v of blockVectors(l)) memory.destroy(v);
  }
}
