// A shard GGUF: the file llama.cpp loads to run layers [start, end) of an artifact, written
// from the shard's verified tensor bytes. llama.cpp's public API loads whole models only, so
// the shard is made to look like one:
//
//   - blocks blk.start … blk.(end-1) renamed blk.0 … blk.(n-1), `<arch>.block_count` = n, and
//     the per-layer metadata arrays (head counts, feed-forward lengths) cut to the range;
//   - no tokenizer (`tokenizer.ggml.model` = "none"), `<arch>.vocab_size` set instead: the
//     real vocabulary size on the last stage (its logits), 1 elsewhere;
//   - llama.cpp's loader requires `token_embd.weight` and `output_norm.weight` on every model,
//     so stages without them get stubs: a one-row F32 token_embd over that one-token
//     vocabulary and an F32 output_norm of ones. The graph is stopped after the last block on
//     those stages, so neither is ever computed with. Stage 0 keeps its real embedding table
//     outside the file (range-stage.ts looks rows up with ggml's own to_float);
//   - the last stage's head goes in as `token_embd.weight` with no `output.weight`: llama.cpp
//     then uses that tensor as the tied output (TENSOR_DUPLICATED, placed like an output
//     matrix), and its embedding role is never used because hidden states come in as
//     embeddings. A tied model's token_embd already is its head.
//

import { open } from 'node:fs/promises';
import { MeshError } from '../../errors.ts';
import { layerOfTensor } from '../../gguf/summary.ts';
import { GgmlType } from '../../gguf/types.ts';
import type { GgufHeader, TensorInfo } from '../../gguf/types.ts';
import { planGguf, writeGguf } from '../../gguf/writer.ts';
import type { MetadataEntry, ScalarKind, TensorSpec } from '../../gguf/writer.ts';
import { OUTPUT_NORM_TENSOR, OUTPUT_TENSOR, TOKEN_EMBD_TENSOR, shardHasEmbedding, shardHasHead, shardTensors } from '../shard.ts';
import type { ShardRange } from '../types.ts';

/** Per-layer metadata arrays (one value per block) that are cut to the shard's range. */
const PER_LAYER_KEYS = ['attention.head_count', 'attention.head_count_kv', 'feed_forward_length', 'attention.sliding_window_pattern'];

/** Where one tensor of the shard GGUF comes from: an artifact tensor, or stub bytes. */
export interface ShardGgufTensor {
  /** name in the shard GGUF */
  name: string;
  type: GgmlType;
  shape: number[];
  /** the artifact tensor whose bytes it carries, or undefined for a stub */
  from?: TensorInfo;
  stub?: Uint8Array;
}

export interface ShardGgufPlan {
  metadata: MetadataEntry[];
  tensors: ShardGgufTensor[];
  /** the artifact's token embedding, which stage 0 keeps outside the file */
  embedding: TensorInfo | null;
  nEmbd: number;
  /** blocks in the shard */
  nBlocks: number;
}

function entry(key: string, type: string, value: unknown): MetadataEntry {
  if (type.startsWith('array:')) {
    const itemType = type.slice(6);
    if (itemType === 'array' || itemType === 'unknown') throw new MeshError('LLAMACPP_SHARD_METADATA', `metadata '${key}': nested arrays cannot be rewritten`);
    return { key, type: 'array', itemType: itemType as ScalarKind, value: value as number[] };
  }
  return { key, type: type as ScalarKind, value: value as string };
}

/** The metadata of the shard GGUF: the artifact's, re-typed as it was, rewritten for the range. */
function shardMetadata(header: GgufHeader, shard: ShardRange, nLayer: number, nVocab: number): MetadataEntry[] {
  const types = header.metadataTypes;
  if (!types) throw new MeshError('LLAMACPP_SHARD_METADATA', 'the model header carries no metadata types; a shard GGUF cannot be written without them');
  const arch = String(header.metadata['general.architecture']);
  const perLayer = new Set(PER_LAYER_KEYS.map((k) => `${arch}.${k}`));
  const out: MetadataEntry[] = [];
  for (const [key, value] of Object.entries(header.metadata)) {
    // the shard has no tokenizer and is one file, whatever the artifact was
    if (key.startsWith('tokenizer.') || key.startsWith('split.') || key === `${arch}.vocab_size`) continue;
    const type = types[key];
    if (!type) throw new MeshError('LLAMACPP_SHARD_METADATA', `the model header does not say the GGUF type of metadata '${key}'`);
    if (key === `${arch}.block_count`) out.push(entry(key, type, shard.end - shard.start));
    else if (perLayer.has(key) && Array.isArray(value)) {
      if (value.length !== nLayer) throw new MeshError('LLAMACPP_SHARD_METADATA', `metadata '${key}' has ${value.length} values for ${nLayer} layers`);
      out.push(entry(key, type, value.slice(shard.start, shard.end)));
    } else out.push(entry(key, type, value));
  }
  out.push({ key: 'tokenizer.ggml.model', type: 'string', value: 'none' });
  out.push({ key: `${arch}.vocab_size`, type: 'uint32', value: nVocab });
  return out;
}

/** Which tensors the shard GGUF holds, named as llama.cpp will see them. */
export function planShardGguf(header: GgufHeader, shard: ShardRange, nLayer: number): ShardGgufPlan {
  const picked = shardTensors(header, shard, nLayer);
  const byName = new Map(header.tensors.map((t) => [t.name, t]));
  const embd = byName.get(TOKEN_EMBD_TENSOR);
  const outputNorm = byName.get(OUTPUT_NORM_TENSOR);
  if (!embd || !outputNorm) throw new MeshError('TENSOR_MISSING', `the artifact lacks ${!embd ? TOKEN_EMBD_TENSOR : OUTPUT_NORM_TENSOR}`);
  const nEmbd = embd.shape[0]!;
  const last = shardHasHead(shard, nLayer);
  const tensors: ShardGgufTensor[] = [];
  let nVocab = 1;
  if (last) {
    const head = byName.get(OUTPUT_TENSOR) ?? embd;
    nVocab = head.shape[1]!;
    tensors.push({ name: TOKEN_EMBD_TENSOR, type: head.type, shape: [...head.shape], from: head });
    tensors.push({ name: OUTPUT_NORM_TENSOR, type: outputNorm.type, shape: [...outputNorm.shape], from: outputNorm });
  } else {
    tensors.push({ name: TOKEN_EMBD_TENSOR, type: GgmlType.F32, shape: [nEmbd, 1], stub: new Uint8Array(nEmbd * 4) });
    tensors.push({ name: OUTPUT_NORM_TENSOR, type: GgmlType.F32, shape: [nEmbd], stub: new Uint8Array(new Float32Array(nEmbd).fill(1).buffer) });
  }
  for (const t of picked) {
    const layer = layerOfTensor(t.name);
    if (layer === undefined) {
      if (t.name !== TOKEN_EMBD_TENSOR && t.name !== OUTPUT_TENSOR && t.name !== OUTPUT_NORM_TENSOR) tensors.push({ name: t.name, type: t.type, shape: [...t.shape], from: t });
      continue;
    }
    tensors.push({ name: t.name.replace(/^blk\.\d+\./, `blk.${layer - shard.start}.`), type: t.type, shape: [...t.shape], from: t });
  }
  return {
    metadata: shardMetadata(header, shard, nLayer, nVocab),
    tensors,
    embedding: shardHasEmbedding(shard) ? embd : null,
    nEmbd,
    nBlocks: shard.end - shard.start,
  };
}

/** Writes the shard GGUF of `plan` to `path` with the artifact tensors' (verified) `bytes`; returns the file's size. */
export async function writeShardGguf(path: string, plan: ShardGgufPlan, bytes: ReadonlyMap<string, Uint8Array>): Promise<number> {
  const specs: TensorSpec[] = plan.tensors.map((t) => ({ name: t.name, type: t.type, shape: t.shape }));
  const layout = planGguf({ metadata: plan.metadata, tensors: specs });
  const header = writeGguf({ metadata: plan.metadata, tensors: specs, headerOnly: true });
  const offsets = new Map(layout.tensors.map((t) => [t.name, t.offset]));
  const file = await open(path, 'w');
  try {
    await file.write(header, 0, header.length, 0);
    for (const t of plan.tensors) {
      const data = t.from ? bytes.get(t.from.name) : t.stub;
      if (!data) throw new MeshError('TENSOR_MISSING', `no bytes for ${t.from?.name ?? t.name}`);
      await file.write(data, 0, data.length, offsets.get(t.name)!);
    }
    await file.truncate(layout.fileBytes);
  } finally {
    await file.close();
  }
  return layout.fileBytes;
}
