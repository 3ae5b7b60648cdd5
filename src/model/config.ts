// Architecture hyper-parameters of a llama-family model, read from GGUF metadata.
// `configFromHeader` (below the types) is the one place that knows metadata key names.

import { MeshError } from '../errors.ts';
import { metadataNumber } from '../gguf/metadata.ts';
import { GgmlType } from '../gguf/types.ts';
import type { GgufHeader, MetadataValue, TensorSource } from '../gguf/types.ts';

export type Architecture = 'llama' | 'qwen2' | 'qwen3';

export const SUPPORTED_ARCHITECTURES: readonly Architecture[] = ['llama', 'qwen2', 'qwen3'];

export type RopeMode = 'normal' | 'neox';

export interface RopeConfig {
  /** 'normal' rotates adjacent pairs (2i, 2i+1); 'neox' rotates (i, i + n_rot/2) */
  mode: RopeMode;
  /** number of rotated dimensions per head (rope.dimension_count, default head_dim) */
  nRot: number;
  freqBase: number;
  /** linear scaling: positions are multiplied by freqScale (= 1 / rope.scaling.factor) */
  freqScale: number;
  /**
   * llama3-style per-frequency scaling factors (rope_freqs.weight), length nRot/2, or null.
   * `configFromHeader` cannot read tensor data: it leaves this null and names the tensor in
   * `freqFactorsTensor`; `loadRopeFreqFactors` fills it in.
   */
  freqFactors: Float32Array | null;
  /** name of the tensor holding the frequency factors, when the artifact has one */
  freqFactorsTensor: string | null;
}

export interface ModelConfig {
  architecture: Architecture;
  nLayer: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  /** per-head dimension of queries and keys (n_embd / n_head unless key_length says otherwise) */
  headDim: number;
  nFf: number;
  nVocab: number;
  nCtxTrain: number;
  rmsEps: number;
  rope: RopeConfig;
  /** output head shares the token embedding (no output.weight tensor) */
  tiedEmbeddings: boolean;
  /** q/k/v projections carry biases (qwen2) */
  qkvBias: boolean;
  /** per-head RMSNorm of queries and keys before RoPE (qwen3) */
  qkNorm: boolean;
}

/** The tensor that holds llama3-style RoPE frequency factors, when present. */
export const ROPE_FREQS_TENSOR = 'rope_freqs.weight';

/**
 * Reads the hyper-parameters of a llama / qwen2 / qwen3 artifact from its header.
 * Throws MeshError UNSUPPORTED_ARCHITECTURE (naming it) for anything else, and
 * BAD_MODEL_METADATA when a required key is missing or inconsistent.
 */
export function configFromHeader(header: GgufHeader): ModelConfig {
  const md = header.metadata;
  const arch = md['general.architecture'];
  if (typeof arch !== 'string') {
    throw new MeshError('BAD_MODEL_METADATA', 'general.architecture is missing or not a string');
  }
  if (!(SUPPORTED_ARCHITECTURES as readonly string[]).includes(arch)) {
    throw new MeshError(
      'UNSUPPORTED_ARCHITECTURE',
      `architecture '${arch}' is not supported (supported: ${SUPPORTED_ARCHITECTURES.join(', ')})`,
      { architecture: arch },
    );
  }
  const architecture = arch as Architecture;
  const key = (k: string) => `${arch}.${k}`;

  const expertCount = optionalInt(md, key('expert_count'), 0);
  if (expertCount > 0) {
    throw new MeshError(
      'UNSUPPORTED_ARCHITECTURE',
      `architecture '${arch}' with ${expertCount} experts (mixture of experts) is not supported`,
      { architecture: arch },
    );
  }

  const nLayer = requiredInt(md, key('block_count'));
  const nEmbd = requiredInt(md, key('embedding_length'));
  const nFf = perLayerInt(md, key('feed_forward_length'), undefined);
  const nHead = perLayerInt(md, key('attention.head_count'), undefined);
  const nHeadKv = perLayerInt(md, key('attention.head_count_kv'), nHead);
  const headDim = optionalInt(md, key('attention.key_length'), Math.floor(nEmbd / nHead));
  const headDimV = optionalInt(md, key('attention.value_length'), headDim);
  if (headDimV !== headDim) {
    throw new MeshError('BAD_MODEL_METADATA', `key_length ${headDim} != value_length ${headDimV} is not supported`);
  }
  if (nHead % nHeadKv !== 0) {
    throw new MeshError('BAD_MODEL_METADATA', `head_count ${nHead} is not a multiple of head_count_kv ${nHeadKv}`);
  }
  const nRot = optionalInt(md, key('rope.dimension_count'), headDim);
  if (nRot > headDim || nRot % 2 !== 0) {
    throw new MeshError('BAD_MODEL_METADATA', `rope.dimension_count ${nRot} must be even and <= head dim ${headDim}`);
  }
  const rmsEps = optionalNumber(md, key('attention.layer_norm_rms_epsilon'), NaN);
  if (!Number.isFinite(rmsEps)) {
    throw new MeshError('BAD_MODEL_METADATA', `${key('attention.layer_norm_rms_epsilon')} is missing`);
  }

  const scalingType = md[key('rope.scaling.type')] ?? 'linear';
  if (scalingType !== 'linear' && scalingType !== 'none') {
    throw new MeshError('UNSUPPORTED_ROPE_SCALING', `rope scaling type '${String(scalingType)}' is not supported (linear, none)`);
  }
  const factor = optionalNumber(md, key('rope.scaling.factor'), optionalNumber(md, key('rope.scale_linear'), 0));
  // f32 arithmetic, as llama.cpp stores it
  const freqScale = scalingType === 'none' || factor === 0 ? 1 : Math.fround(1 / factor);

  const tensorNames = new Set(header.tensors.map((t) => t.name));
  const embd = header.tensors.find((t) => t.name === 'token_embd.weight');
  const nVocab = optionalInt(md, key('vocab_size'), tokenListLength(md) ?? embd?.shape[1] ?? 0);
  if (nVocab <= 0) throw new MeshError('BAD_MODEL_METADATA', 'vocabulary size is unknown');

  const freqTensor = header.tensors.find((t) => t.name === ROPE_FREQS_TENSOR);

  return {
    architecture,
    nLayer,
    nEmbd,
    nHead,
    nHeadKv,
    headDim,
    nFf,
    nVocab,
    nCtxTrain: optionalInt(md, key('context_length'), 2048),
    rmsEps: Math.fround(rmsEps),
    rope: {
      mode: architecture === 'llama' ? 'normal' : 'neox',
      nRot,
      freqBase: Math.fround(optionalNumber(md, key('rope.freq_base'), 10000)),
      freqScale,
      freqFactors: null,
      freqFactorsTensor: freqTensor ? freqTensor.name : null,
    },
    tiedEmbeddings: !tensorNames.has('output.weight'),
    qkvBias: tensorNames.has('blk.0.attn_q.bias'),
    qkNorm: architecture === 'qwen3' || tensorNames.has('blk.0.attn_q_norm.weight'),
  };
}

/** Reads rope_freqs.weight (when the artifact has one) into config.rope.freqFactors. */
export async function loadRopeFreqFactors(config: ModelConfig, source: TensorSource): Promise<void> {
  const name = config.rope.freqFactorsTensor;
  if (!name || config.rope.freqFactors) return;
  const info = source.header.tensors.find((t) => t.name === name);
  if (!info) throw new MeshError('TENSOR_MISSING', `${name} is named by the config but not in ${source.location}`);
  if (info.type !== GgmlType.F32 || info.nElements !== config.rope.nRot / 2) {
    throw new MeshError('BAD_MODEL_METADATA', `${name} must be F32 with ${config.rope.nRot / 2} elements`);
  }
  const bytes = (await source.read([info])).get(name)!;
  const copy = bytes.slice(); // aligned copy
  config.rope.freqFactors = new Float32Array(copy.buffer, copy.byteOffset, info.nElements);
}

function tokenListLength(md: Record<string, MetadataValue>): number | undefined {
  const tokens = md['tokenizer.ggml.tokens'];
  return Array.isArray(tokens) ? tokens.length : undefined;
}

function requiredInt(md: Record<string, MetadataValue>, k: string): number {
  const n = metadataNumber(md[k]);
  if (n === undefined || !Number.isSafeInteger(n) || n <= 0) {
    throw new MeshError('BAD_MODEL_METADATA', `${k} is missing or not a positive integer`);
  }
  return n;
}

function optionalInt(md: Record<string, MetadataValue>, k: string, fallback: number): number {
  if (md[k] === undefined) return fallback;
  return requiredInt(md, k);
}

function optionalNumber(md: Record<string, MetadataValue>, k: string, fallback: number): number {
  const n = metadataNumber(md[k]);
  return n === undefined ? fallback : n;
}

/** A key that may be a per-layer array: accepted when every layer has the same value. */
function perLayerInt(md: Record<string, MetadataValue>, k: string, fallback: number | undefined): number {
  const v = md[k];
  if (v === undefined && fallback !== undefined) return fallback;
  if (Array.isArray(v)) {
    const values = new Set(v.map((x) => metadataNumber(x)));
    const only = values.size === 1 ? [...values][0] : undefined;
    if (only === undefined || !Number.isSafeInteger(only) || only <= 0) {
      throw new MeshError('BAD_MODEL_METADATA', `${k} differs between layers, which is not supported`);
    }
    return only;
  }
  return requiredInt(md, k);
}
