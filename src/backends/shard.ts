// Which tensors a shard needs. A shard is layers [start, end) of one artifact, plus the token
// embedding when start == 0 and the output norm + head when end == n_layer. Backends load
// exactly these; the manifest and the route planner use the same answer.

import { MeshError } from '../errors.ts';
import { layerOfTensor } from '../gguf/summary.ts';
import type { GgufHeader, TensorInfo } from '../gguf/types.ts';
import { ROPE_FACTOR_TENSORS } from '../model/config.ts';
import type { ShardRange } from './types.ts';

export const TOKEN_EMBD_TENSOR = 'token_embd.weight';
export const OUTPUT_NORM_TENSOR = 'output_norm.weight';
export const OUTPUT_TENSOR = 'output.weight';

/** Throws BAD_SHARD unless 0 <= start < end <= nLayer (all integers). */
export function validateShard(shard: ShardRange, nLayer: number): void {
  const { start, end } = shard;
  if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end <= start || end > nLayer) {
    throw new MeshError('BAD_SHARD', `shard [${start}, ${end}) is not a non-empty layer range within [0, ${nLayer})`);
  }
}

export function shardHasEmbedding(shard: ShardRange): boolean {
  return shard.start === 0;
}

export function shardHasHead(shard: ShardRange, nLayer: number): boolean {
  return shard.end === nLayer;
}

/**
 * The tensors shard [start, end) reads, in file order: every `blk.N.*` with start <= N < end,
 * token_embd.weight when start == 0, output_norm.weight and output.weight (or, for tied
 * embeddings, token_embd.weight) when end == nLayer, and the rope frequency factors
 * (rope_freqs.weight, Phi-3's rope_factors_short/long; shared by all layers) the artifact has.
 */
export function shardTensors(header: GgufHeader, shard: ShardRange, nLayer: number): TensorInfo[] {
  validateShard(shard, nLayer);
  const names = new Set(header.tensors.map((t) => t.name));
  const wanted = new Set<string>();
  if (shardHasEmbedding(shard)) wanted.add(TOKEN_EMBD_TENSOR);
  if (shardHasHead(shard, nLayer)) {
    wanted.add(OUTPUT_NORM_TENSOR);
    wanted.add(names.has(OUTPUT_TENSOR) ? OUTPUT_TENSOR : TOKEN_EMBD_TENSOR);
  }
  for (const name of ROPE_FACTOR_TENSORS) if (names.has(name)) wanted.add(name);
  const picked = header.tensors.filter((t) => {
    const layer = layerOfTensor(t.name);
    return layer === undefined ? wanted.has(t.name) : layer >= shard.start && layer < shard.end;
  });
  for (const name of wanted) {
    if (!names.has(name)) throw new MeshError('TENSOR_MISSING', `shard [${shard.start}, ${shard.end}) needs ${name}, which the artifact lacks`);
  }
  return picked;
}

/** Bytes of tensor data a shard reads. */
export function shardBytes(header: GgufHeader, shard: ShardRange, nLayer: number): number {
  return shardTensors(header, shard, nLayer).reduce((sum, t) => sum + t.byteLength, 0);
}

/**
 * Parses a layer split such as "0-2,2-5" into shards. They must be contiguous, start at 0 and
 * end at nLayer; otherwise BAD_SHARD names the gap or overlap.
 */
export function parseLayerRanges(spec: string, nLayer: number): ShardRange[] {
  const shards: ShardRange[] = [];
  for (const part of spec.split(',')) {
    const m = /^\s*(\d+)\s*-\s*(\d+)\s*$/.exec(part);
    if (!m) throw new MeshError('BAD_SHARD', `layer range '${part}' is not of the form a-b`);
    shards.push({ start: Number(m[1]), end: Number(m[2]) });
  }
  let expected = 0;
  for (const s of shards) {
    validateShard(s, nLayer);
    if (s.start !== expected) {
      throw new MeshError('BAD_SHARD', `layer ranges must be contiguous from 0: expected a range starting at ${expected}, got ${s.start}-${s.end}`);
    }
    expected = s.end;
  }
  if (expected !== nLayer) {
    throw new MeshError('BAD_SHARD', `layer ranges end at ${expected}, but the model has ${nLayer} layers`);
  }
  return shards;
}
