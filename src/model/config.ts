// Architecture hyper-parameters of a model we run, read from GGUF metadata: the llama family
// (llama, qwen2, qwen3), their mixtures of experts (qwen2moe, qwen3moe), gemma3, phi3, and the
// hybrid Qwen3.5 family (qwen35, qwen35moe). `configFromHeader` (below the types) is the one
// place that knows metadata key names; the rope's live in ./rope-config.ts, the hybrid layout's
// in ./qwen35-config.ts.

import { MeshError } from '../errors.ts';
import { metadataNumber } from '../gguf/metadata.ts';
import type { GgufHeader, MetadataValue } from '../gguf/types.ts';
import { hybridConfig } from './qwen35-config.ts';
import type { HybridConfig } from './qwen35-config.ts';
import { longRope, ropeFromMetadata, swaRope } from './rope-config.ts';
import type { RopeSet } from './rope-config.ts';

export type { HybridConfig, LinearAttentionConfig } from './qwen35-config.ts';

export type { RopeConfig, RopeMode, RopeSet } from './rope-config.ts';
export { loadRopeFreqFactors, ROPE_FACTOR_TENSORS, ROPE_FREQS_TENSOR, ropeFor } from './rope-config.ts';

export type Architecture = 'llama' | 'qwen2' | 'qwen3' | 'qwen2moe' | 'qwen3moe' | 'gemma3' | 'phi3' | 'qwen35' | 'qwen35moe';

export const SUPPORTED_ARCHITECTURES: readonly Architecture[] = ['llama', 'qwen2', 'qwen3', 'qwen2moe', 'qwen3moe', 'gemma3', 'phi3', 'qwen35', 'qwen35moe'];

/** The gated feed-forward's activation: SiLU (SwiGLU) or tanh-GELU (GeGLU, Gemma). */
export type FfnActivation = 'silu' | 'gelu';

/** A mixture-of-experts feed-forward (llama.cpp's build_moe_ffn with softmax gating). */
export interface MoeConfig {
  nExpert: number;
  /** experts each token is routed to (top-k) */
  nExpertUsed: number;
  /** feed-forward size of one expert */
  nFfExp: number;
  /** divide the top-k router weights by their sum (qwen3moe), or use the softmax as is (qwen2moe) */
  normWeights: boolean;
  /** feed-forward size of the always-on shared expert with its sigmoid gate (qwen2moe, qwen35moe), 0 = none */
  nFfShared: number;
  /** the shared expert's gate as ggml_sigmoid (qwen35moe); absent: silu(g)/g as qwen2moe's graph */
  sigmoidSharedGate?: true;
}

export interface ModelConfig extends RopeSet, HybridConfig {
  architecture: Architecture;
  nLayer: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  /** per-head dimension of queries and keys (n_embd / n_head unless key_length says otherwise) */
  headDim: number;
  /** dense feed-forward size (qwen2moe: the shared expert's default) */
  nFf: number;
  nVocab: number;
  nCtxTrain: number;
  rmsEps: number;
  /** output head shares the token embedding (no output.weight tensor) */
  tiedEmbeddings: boolean;
  /** q/k/v projections carry biases (qwen2) */
  qkvBias: boolean;
  /** per-head RMSNorm of queries and keys before RoPE (qwen3, gemma3) */
  qkNorm: boolean;
  ffnActivation: FfnActivation;
  /** the feed-forward is a mixture of experts, or null for a dense one */
  moe: MoeConfig | null;
  /** token embeddings are multiplied by this (gemma3: √n_embd in f32), else 1 */
  embedScale: number;
  /** RMSNorm of the attention and feed-forward outputs before each residual add (gemma3) */
  postNorms: boolean;
  /**
   * queries are multiplied by this after RoPE and attention scores are not scaled again
   * (gemma3, phi3, as their llama.cpp graphs do); null: scores are scaled by 1/√head_dim
   */
  queryScale: number | null;
  /** keys older than this many positions are masked in the sliding-window layers; 0 = none */
  slidingWindow: number;
  /** logits = c·tanh(logits / c) when c > 0 (final_logit_softcapping) */
  finalLogitSoftcap: number;
}

const f32 = Math.fround;

/**
 * Reads the hyper-parameters of an artifact of a supported architecture from its header.
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

  const nLayer = requiredInt(md, key('block_count'));
  const nEmbd = requiredInt(md, key('embedding_length'));
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

  const tensorNames = new Set(header.tensors.map((t) => t.name));
  const embd = header.tensors.find((t) => t.name === 'token_embd.weight');
  const nVocab = optionalInt(md, key('vocab_size'), tokenListLength(md) ?? embd?.shape[1] ?? 0);
  if (nVocab <= 0) throw new MeshError('BAD_MODEL_METADATA', 'vocabulary size is unknown');
  const nCtxTrain = optionalInt(md, key('context_length'), 2048);

  const moe = moeConfig(md, architecture);
  const nFf = moe && architecture !== 'qwen2moe' ? optionalPerLayerInt(md, key('feed_forward_length'), 0) : perLayerInt(md, key('feed_forward_length'), undefined);
  const gemma = architecture === 'gemma3';
  const rope = ropeFromMetadata(md, arch, architecture === 'llama' ? 'normal' : 'neox', nRot, nCtxTrain, tensorNames);
  const slidingWindow = gemma ? optionalInt(md, key('attention.sliding_window'), 0) : 0;
  // llama.cpp's set_swa_pattern: within each period of n layers, all but the last slide
  const period = optionalInt(md, key('attention.sliding_window_pattern'), 6);
  const swaLayers = Array.from({ length: nLayer }, (_, il) => slidingWindow > 0 && il % period < period - 1);

  const hybrid = hybridConfig(md, arch, nLayer, nRot);
  const sharedFfn = architecture === 'qwen2moe' || architecture === 'qwen35moe' ? optionalInt(md, key('expert_shared_feed_forward_length'), nFf) : 0;
  return {
    ...hybrid,
    architecture,
    nLayer,
    nEmbd,
    nHead,
    nHeadKv,
    headDim,
    nFf,
    nVocab,
    nCtxTrain,
    rmsEps: f32(rmsEps),
    rope,
    ropeSwa: slidingWindow > 0 ? swaRope(md, arch, rope) : null,
    ropeLong: architecture === 'phi3' ? longRope(rope, tensorNames) : null,
    swaLayers,
    tiedEmbeddings: !tensorNames.has('output.weight'),
    qkvBias: tensorNames.has('blk.0.attn_q.bias'),
    qkNorm: architecture === 'qwen3' || architecture === 'qwen3moe' || gemma || hybrid.attnOutputGate || tensorNames.has('blk.0.attn_q_norm.weight'),
    ffnActivation: gemma ? 'gelu' : 'silu',
    moe: moe && { ...moe, nFfShared: sharedFfn, ...(architecture === 'qwen35moe' ? { sigmoidSharedGate: true as const } : {}) },
    embedScale: gemma ? f32(Math.sqrt(nEmbd)) : 1,
    postNorms: gemma,
    queryScale: queryScale(architecture, nLayer, nEmbd, nHead, headDim),
    slidingWindow,
    finalLogitSoftcap: gemma ? optionalNumber(md, key('final_logit_softcapping'), 0) : 0,
  };
}

/** gemma3 and phi3 scale queries before attention (Gemma 3 27B, 62 layers, by 1/√(n_embd/n_head)). */
function queryScale(arch: Architecture, nLayer: number, nEmbd: number, nHead: number, headDim: number): number | null {
  if (arch === 'gemma3') return f32(1 / f32(Math.sqrt(nLayer === 62 ? Math.floor(nEmbd / nHead) : headDim)));
  if (arch === 'phi3') return f32(1 / f32(Math.sqrt(headDim)));
  return null;
}

/** The expert settings of qwen2moe / qwen3moe / qwen35moe; null for dense architectures. */
function moeConfig(md: Record<string, MetadataValue>, arch: Architecture): Omit<MoeConfig, 'nFfShared'> | null {
  const key = (k: string) => `${arch}.${k}`;
  const nExpert = optionalInt(md, key('expert_count'), 0);
  if (arch !== 'qwen2moe' && arch !== 'qwen3moe' && arch !== 'qwen35moe') {
    if (nExpert > 0) {
      throw new MeshError('UNSUPPORTED_ARCHITECTURE', `architecture '${arch}' with ${nExpert} experts (mixture of experts) is not supported`, { architecture: arch });
    }
    return null;
  }
  if (nExpert === 0) throw new MeshError('BAD_MODEL_METADATA', `${arch} needs ${key('expert_count')}`);
  const nExpertUsed = perLayerInt(md, key('expert_used_count'), undefined);
  if (nExpertUsed > nExpert) throw new MeshError('BAD_MODEL_METADATA', `${key('expert_used_count')} ${nExpertUsed} exceeds expert_count ${nExpert}`);
  const nFf = optionalPerLayerInt(md, key('feed_forward_length'), 0);
  const nFfExp = optionalPerLayerInt(md, key('expert_feed_forward_length'), Math.floor(nFf / nExpertUsed));
  if (nFfExp <= 0) throw new MeshError('BAD_MODEL_METADATA', `${key('expert_feed_forward_length')} is missing`);
  if ((optionalInt(md, key('expert_group_count'), 0)) > 1) {
    throw new MeshError('UNSUPPORTED_ARCHITECTURE', `${arch} with grouped expert selection is not supported`, { architecture: arch });
  }
  return { nExpert, nExpertUsed, nFfExp, normWeights: arch !== 'qwen2moe' };
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

function optionalPerLayerInt(md: Record<string, MetadataValue>, k: string, fallback: number): number {
  return md[k] === undefined ? fallback : perLayerInt(md, k, undefined);
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
