// What a GGUF header says about its model, for any architecture: hyper-parameters read from
// the `<arch>.*` metadata keys, and the tensor groups that make up each shard unit.
// (src/model/config.ts turns a header into a full ModelConfig for the architectures we run;
// this module only describes, so it also works for architectures we cannot run.)

import { MeshError } from '../errors.ts';
import { architectureOf, metadataNumber, requiredNumber } from './metadata.ts';
import { ggmlTypeName } from './traits.ts';
import type { GgufHeader, MetadataValue, TensorInfo } from './types.ts';

/** A hyper-parameter: a number, or one number per layer where the model varies it. */
export type PerLayer = number | number[];

export interface RopeSummary {
  /** rotated dimensions per head (rope.dimension_count), null when absent */
  dimension_count: number | null;
  freq_base: number;
  /** 'none' | 'linear' | 'yarn' | … (rope.scaling.type) */
  scaling_type: string;
  scaling_factor: number | null;
  /** original context of a scaled model (rope.scaling.original_context_length) */
  scaling_orig_ctx: number | null;
}

export interface HyperParameters {
  architecture: string;
  n_layer: number;
  n_embd: number;
  n_head: PerLayer;
  n_head_kv: PerLayer;
  n_ff: PerLayer;
  n_vocab: number;
  n_ctx_train: number;
  rope: RopeSummary;
}

function perLayer(v: MetadataValue | undefined): PerLayer | undefined {
  if (Array.isArray(v)) {
    const nums = v.map((x) => metadataNumber(x));
    if (nums.every((x) => x !== undefined)) return nums as number[];
    return undefined;
  }
  return metadataNumber(v);
}

/** Reads the hyper-parameters of any architecture; throws GGUF_MISSING_METADATA naming the key. */
export function hyperParameters(header: GgufHeader, location = 'GGUF'): HyperParameters {
  const md = header.metadata;
  const arch = architectureOf(header, location);
  const key = (k: string) => `${arch}.${k}`;
  const required = (k: string): number => requiredNumber(header, key(k), location);
  const optional = (k: string): number | undefined => metadataNumber(md[key(k)]);
  const nHead = perLayer(md[key('attention.head_count')]) ?? 0;
  const tokens = md['tokenizer.ggml.tokens'];
  const embd = header.tensors.find((t) => t.name === 'token_embd.weight');
  const nVocab = optional('vocab_size') ?? (Array.isArray(tokens) ? tokens.length : undefined) ?? embd?.shape[1] ?? 0;
  const scalingType = md[key('rope.scaling.type')];
  return {
    architecture: arch,
    n_layer: checkedBlockCount(header, required('block_count'), location),
    n_embd: required('embedding_length'),
    n_head: nHead,
    n_head_kv: perLayer(md[key('attention.head_count_kv')]) ?? nHead,
    n_ff: perLayer(md[key('feed_forward_length')]) ?? 0,
    n_vocab: nVocab,
    n_ctx_train: optional('context_length') ?? 0,
    rope: {
      dimension_count: optional('rope.dimension_count') ?? null,
      freq_base: optional('rope.freq_base') ?? 10000,
      scaling_type: typeof scalingType === 'string' ? scalingType : optional('rope.scale_linear') ? 'linear' : 'none',
      scaling_factor: optional('rope.scaling.factor') ?? optional('rope.scale_linear') ?? null,
      scaling_orig_ctx: optional('rope.scaling.original_context_length') ?? null,
    },
  };
}

/**
 * block_count, checked against the blk.N tensors (any architecture names its layers so): the
 * count sizes per-layer arrays, so a lying one is refused before anything is allocated for it.
 */
function checkedBlockCount(header: GgufHeader, n: number, location: string): number {
  let top = -1;
  for (const t of header.tensors) top = Math.max(top, layerOfTensor(t.name) ?? -1);
  if (!Number.isSafeInteger(n) || n < 0 || (header.tensors.length > 0 && n !== top + 1)) {
    throw new MeshError('GGUF_BAD_METADATA', `${location}: block_count is ${n} but the layer tensors are blk.0 … blk.${top} (${top + 1} blocks)`);
  }
  return n;
}

/** Tensor type name → number of tensors of that type, names sorted. */
export function tensorTypeHistogram(tensors: readonly TensorInfo[]): Record<string, number> {
  const counts = new Map<string, number>();
  for (const t of tensors) counts.set(ggmlTypeName(t.type), (counts.get(ggmlTypeName(t.type)) ?? 0) + 1);
  return Object.fromEntries([...counts.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/**
 * One shard unit: the tensors a stage must hold to serve it.
 * - `embed`: token_embd.* (and other input embeddings); held by the first stage
 * - `layer.N`: every blk.N.* tensor
 * - `head`: output_norm.* and output.*; with tied embeddings it also uses token_embd.weight
 * - `global`: any other tensor (e.g. rope_freqs.weight), needed by every stage
 */
export interface TensorGroup {
  name: string;
  /** tensors that belong to this group, in file order */
  tensors: string[];
  /** tensors of other groups this one also needs (the tied embedding for `head`) */
  uses: string[];
  /** sum of byteLength over `tensors` (not `uses`) */
  bytes: number;
}

const EMBED_RE = /^(token_embd|token_embd_norm|token_types|position_embd)\./;
const HEAD_RE = /^(output_norm|output)\./;
const LAYER_RE = /^blk\.(\d+)\./;

/** The block index of a `blk.N.*` tensor name; undefined for any other tensor. */
export function layerOfTensor(name: string): number | undefined {
  const m = LAYER_RE.exec(name);
  return m ? Number(m[1]) : undefined;
}

const EXPERT_RE = /_exps\.(weight|bias|scale)$/;

/**
 * A routed-expert tensor (blk.N.ffn_{gate,up,down,gate_up}_exps.*): one slice per expert, of
 * which a token reads only its top-k. Shard groups count its bytes in full, since a stage holds
 * every expert of its layers.
 */
export function isExpertTensor(name: string): boolean {
  return EXPERT_RE.test(name);
}

/** token_embd.* and the other input embeddings: the first stage's tensors. */
export function isEmbeddingTensor(name: string): boolean {
  return EMBED_RE.test(name);
}

/** Groups tensors into embed, layer.0 … layer.{n-1}, head and (if any) global, in that order. */
export function tensorGroups(header: GgufHeader, nLayer: number): TensorGroup[] {
  // one group per layer: never more layers than tensors (a lying count would size this array)
  if (!Number.isSafeInteger(nLayer) || nLayer < 0 || nLayer > header.tensors.length) {
    throw new MeshError('GGUF_BAD_METADATA', `${nLayer} layers cannot be cut from ${header.tensors.length} tensors`);
  }
  const embed: TensorGroup = { name: 'embed', tensors: [], uses: [], bytes: 0 };
  const head: TensorGroup = { name: 'head', tensors: [], uses: [], bytes: 0 };
  const global: TensorGroup = { name: 'global', tensors: [], uses: [], bytes: 0 };
  const layers: TensorGroup[] = Array.from({ length: nLayer }, (_, i) => ({ name: `layer.${i}`, tensors: [], uses: [], bytes: 0 }));
  const byOffset = [...header.tensors].sort((a, b) => a.offset - b.offset);
  for (const t of byOffset) {
    const i = layerOfTensor(t.name);
    let g: TensorGroup;
    if (i !== undefined) {
      g = layers[i] ?? global; // a blk index past block_count is kept, as a global tensor
    } else if (isEmbeddingTensor(t.name)) g = embed;
    else if (HEAD_RE.test(t.name)) g = head;
    else g = global;
    g.tensors.push(t.name);
    g.bytes += t.byteLength;
  }
  if (!header.tensors.some((t) => t.name === 'output.weight') && header.tensors.some((t) => t.name === 'token_embd.weight')) {
    head.uses.push('token_embd.weight'); // tied output head
  }
  return [embed, ...layers, head, ...(global.tensors.length ? [global] : [])];
}
