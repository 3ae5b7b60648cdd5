// Random-weight GGUF models of any shape and quant type, with a real tokenizer, for tests and
// benchmarks. Tensor names, shapes and metadata keys are the ones llama.cpp loads for the
// `llama`, `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `gemma3`, `phi3`, `qwen35` and `qwen35moe`
// architectures (the tensors per architecture: ./synthetic-tensors.ts, the hybrid Qwen3.5
// blocks: ./synthetic-qwen35.ts). Deterministic: every tensor draws from
// its own PRNG stream seeded by (seed, tensor name), so the same options give the same bytes
// however the file is produced (in memory, streamed, or chunked differently).
//
// Types: `f32` keeps everything F32; the others give every matrix that type (like
// llama-quantize --pure) with norms, biases and MoE routers F32; `q4_k_m` / `q5_k_m` mix
// Q4_K / Q5_K with Q6_K the way llama.cpp's Q4_K_M / Q5_K_M do (output, and attn_v/ffn_down of
// the layers its use_more_bits picks, in Q6_K; a tied token_embd is the output head, so Q6_K
// too). K-quant rows must be multiples of 256 values: instead of llama.cpp's silent fall-back
// to other types we refuse such shapes with a reason.

import { MeshError } from '../errors.ts';
import type { GgufSpec, MetadataEntry, WrittenLayout } from '../gguf/writer.ts';
import { planGguf, writeGguf, writeGgufFile } from '../gguf/writer.ts';
import { hybridLayerTensors, hybridMetadata, isHybridArch } from './synthetic-qwen35.ts';
import { MODEL_TYPES, modelTensors } from './synthetic-tensors.ts';
import type { ModelType } from './synthetic-tensors.ts';
import type { BpePre, TokenizerKind } from './synthetic-vocab.ts';
import { BPE_PRES, buildVocab, minVocabSize } from './synthetic-vocab.ts';

export const ARCHS = ['llama', 'qwen2', 'qwen3', 'qwen2moe', 'qwen3moe', 'gemma3', 'phi3', 'qwen35', 'qwen35moe'] as const;
export type SyntheticArch = (typeof ARCHS)[number];
export { MODEL_TYPES };
export type { ModelType };
export const ROPE_SCALINGS = ['none', 'linear', 'yarn'] as const;
export type RopeScaling = (typeof ROPE_SCALINGS)[number];

const MOE_ARCHS: readonly SyntheticArch[] = ['qwen2moe', 'qwen3moe', 'qwen35moe'];

export interface MakeModelOptions {
  arch?: SyntheticArch;
  /** transformer blocks */
  layers?: number;
  /** hidden size n_embd */
  embd?: number;
  heads?: number;
  /** KV heads (GQA when fewer than heads); default = heads */
  kvHeads?: number;
  /** size of one attention head; default embd/heads (Qwen3 models use other sizes) */
  headDim?: number;
  /** tie the output head to token_embd (no output.weight), as small Llama/Qwen models do */
  tied?: boolean;
  /** feed-forward size n_ff */
  ffn?: number;
  vocab?: number;
  /** n_ctx_train */
  ctx?: number;
  type?: ModelType;
  seed?: number;
  /** default: llama for the llama arch, gpt2 for qwen */
  tokenizer?: TokenizerKind;
  /** gpt2 pre-tokenizer; default llama-bpe for llama, qwen2 for qwen */
  pre?: BpePre;
  /** write the header with full tensor infos but no tensor data */
  headerOnly?: boolean;
  /** experts per MoE layer (qwen2moe, qwen3moe; default 4) */
  experts?: number;
  /** experts each token is routed to (default 2) */
  expertsUsed?: number;
  /** feed-forward size of one expert (default ffn) */
  expertFfn?: number;
  /** qwen2moe: feed-forward size of the shared expert (default ffn) */
  sharedFfn?: number;
  /** gemma3: sliding-window size (0 = every layer global; default 512) */
  slidingWindow?: number;
  /** gemma3: every n-th layer is global, the others slide (default 6) */
  swaPattern?: number;
  /** rope.scaling.type written (default none) */
  ropeScaling?: RopeScaling;
  /** rope.scaling.factor for linear or yarn (default 4) */
  ropeFactor?: number;
  /** rope.scaling.original_context_length (yarn, phi3's long factors; default ctx) */
  ropeOrigCtx?: number;
  /** write llama3-style rope_freqs.weight (llama) */
  ropeFreqs?: boolean;
  /** qwen35*: Gated DeltaNet q/k heads (default heads) */
  linearKHeads?: number;
  /** qwen35*: Gated DeltaNet v heads (default 2 × linearKHeads, as Qwen3.5) */
  linearVHeads?: number;
  /** qwen35*: size of one DeltaNet head (default head size) */
  linearHeadDim?: number;
  /** qwen35*: causal conv width (default 4) */
  convKernel?: number;
  /** qwen35*: every n-th block is full attention (default 4) */
  fullAttnInterval?: number;
  /** rotated dimensions per head (default: the head size; qwen35*: a quarter of it) */
  ropeDims?: number;
}

export type ResolvedModelOptions = Required<Omit<MakeModelOptions, 'pre' | 'headerOnly'>> & { pre?: BpePre; headerOnly: boolean };

const FILE_TYPE: Record<ModelType, number> = {
  f32: 0, f16: 1, q4_0: 2, q4_1: 3, q8_0: 7, q5_0: 8, q5_1: 9, q2_k: 10, q3_k: 12, q4_k: 14, q4_k_m: 15,
  q5_k: 16, q5_k_m: 17, q6_k: 18, iq4_nl: 25, iq4_xs: 30, bf16: 32, mxfp4: 38,
};

export const MODEL_DEFAULTS = {
  arch: 'llama',
  layers: 2,
  embd: 256,
  heads: 4,
  ffn: 768,
  vocab: 1024,
  ctx: 2048,
  type: 'f32',
  seed: 0,
} as const;

function badOption(message: string): MeshError {
  return new MeshError('MAKE_MODEL_BAD_OPTION', message);
}

/** Fills defaults and checks that the shape is one llama.cpp can load. */
export function resolveModelOptions(o: MakeModelOptions): ResolvedModelOptions {
  const arch = o.arch ?? MODEL_DEFAULTS.arch;
  if (!ARCHS.includes(arch)) throw badOption(`unknown arch '${arch}' (known: ${ARCHS.join(', ')})`);
  const type = o.type ?? MODEL_DEFAULTS.type;
  if (!MODEL_TYPES.includes(type)) throw badOption(`unknown type '${type}' (known: ${MODEL_TYPES.join(', ')})`);
  const heads = o.heads ?? MODEL_DEFAULTS.heads;
  const r: ResolvedModelOptions = {
    arch,
    layers: o.layers ?? MODEL_DEFAULTS.layers,
    embd: o.embd ?? MODEL_DEFAULTS.embd,
    heads,
    kvHeads: o.kvHeads ?? heads,
    headDim: o.headDim ?? (heads > 0 && (o.embd ?? MODEL_DEFAULTS.embd) % heads === 0 ? (o.embd ?? MODEL_DEFAULTS.embd) / heads : 0),
    tied: o.tied ?? false,
    ffn: o.ffn ?? MODEL_DEFAULTS.ffn,
    vocab: o.vocab ?? MODEL_DEFAULTS.vocab,
    ctx: o.ctx ?? MODEL_DEFAULTS.ctx,
    type,
    seed: o.seed ?? MODEL_DEFAULTS.seed,
    tokenizer: o.tokenizer ?? (arch === 'llama' || arch === 'gemma3' || arch === 'phi3' ? 'llama' : 'gpt2'),
    headerOnly: o.headerOnly ?? false,
    experts: o.experts ?? 4,
    expertsUsed: o.expertsUsed ?? 2,
    expertFfn: o.expertFfn ?? o.ffn ?? MODEL_DEFAULTS.ffn,
    sharedFfn: o.sharedFfn ?? o.ffn ?? MODEL_DEFAULTS.ffn,
    slidingWindow: o.slidingWindow ?? 512,
    swaPattern: o.swaPattern ?? 6,
    ropeScaling: o.ropeScaling ?? 'none',
    ropeFactor: o.ropeFactor ?? 4,
    ropeOrigCtx: o.ropeOrigCtx ?? o.ctx ?? MODEL_DEFAULTS.ctx,
    ropeFreqs: o.ropeFreqs ?? false,
    ...hybridDefaults(o, arch, heads),
  };
  if (r.tokenizer !== 'llama' && r.tokenizer !== 'gpt2') throw badOption(`unknown tokenizer '${String(r.tokenizer)}' (known: llama, gpt2)`);
  if (o.pre !== undefined) {
    if (r.tokenizer !== 'gpt2') throw badOption(`--pre applies to the gpt2 tokenizer only`);
    if (!BPE_PRES.includes(o.pre)) throw badOption(`unknown pre-tokenizer '${o.pre}' (known: ${BPE_PRES.join(', ')})`);
  }
  if (r.tokenizer === 'gpt2') r.pre = o.pre ?? (arch === 'llama' ? 'llama-bpe' : isHybridArch(arch) ? 'qwen35' : 'qwen2');
  if (!ROPE_SCALINGS.includes(r.ropeScaling)) throw badOption(`unknown rope scaling '${String(r.ropeScaling)}' (known: ${ROPE_SCALINGS.join(', ')})`);
  if (!(r.ropeFactor > 0)) throw badOption(`rope-factor must be positive, got ${r.ropeFactor}`);
  if (r.slidingWindow < 0 || !Number.isSafeInteger(r.slidingWindow)) throw badOption(`sliding-window must be an integer >= 0, got ${r.slidingWindow}`);
  for (const k of ['layers', 'embd', 'heads', 'kvHeads', 'ffn', 'vocab', 'ctx', 'experts', 'expertsUsed', 'expertFfn', 'sharedFfn', 'swaPattern', 'ropeOrigCtx'] as const) {
    if (!Number.isSafeInteger(r[k]) || r[k] < 1) throw badOption(`${k} must be a positive integer, got ${r[k]}`);
  }
  if (o.headDim !== undefined && (!Number.isSafeInteger(o.headDim) || o.headDim < 1)) throw badOption(`head-dim must be a positive integer, got ${o.headDim}`);
  if (!Number.isSafeInteger(r.seed) || r.seed < 0 || r.seed > 0xffffffff) throw badOption(`seed must be an integer in [0, 2^32), got ${r.seed}`);
  if (o.headDim === undefined && r.embd % r.heads !== 0) throw badOption(`embd ${r.embd} is not divisible by heads ${r.heads} (or give --head-dim)`);
  if (r.headDim % 2 !== 0) throw badOption(`head size ${r.headDim} must be even for RoPE`);
  checkHybrid(r); // after the head checks: its defaults derive from the head size
  // llama.cpp's qwen2, qwen2moe and phi3 loaders fix attn_q/attn_output at [embd, embd]
  if ((r.arch === 'qwen2' || r.arch === 'qwen2moe' || r.arch === 'phi3') && r.headDim * r.heads !== r.embd) {
    throw badOption(`${r.arch} needs heads × head-dim = embd, got ${r.heads} × ${r.headDim} ≠ ${r.embd}`);
  }
  if (MOE_ARCHS.includes(r.arch) && r.expertsUsed > r.experts) throw badOption(`experts-used ${r.expertsUsed} exceeds experts ${r.experts}`);
  // llama.cpp's qwen2moe loader requires output.weight
  if (r.arch === 'qwen2moe' && r.tied) throw badOption('qwen2moe cannot tie its output head (llama.cpp requires output.weight)');
  if (r.ropeFreqs && r.arch !== 'llama') throw badOption('rope-freqs applies to the llama architecture only (llama.cpp reads it there)');
  if (r.kvHeads > r.heads || r.heads % r.kvHeads !== 0) throw badOption(`heads ${r.heads} must be a multiple of kv-heads ${r.kvHeads}`);
  const min = minVocabSize(r.tokenizer);
  if (r.vocab < min) throw badOption(`vocab ${r.vocab} is too small for the ${r.tokenizer} tokenizer: it needs at least ${min} tokens (specials, 256 bytes${r.tokenizer === 'llama' ? ', base characters' : ''})`);
  return r;
}

/** The qwen35* shape options, filled in (also present, unused, for the other architectures). */
function hybridDefaults(o: MakeModelOptions, arch: SyntheticArch, heads: number) {
  const embd = o.embd ?? MODEL_DEFAULTS.embd;
  const headDim = o.headDim ?? (heads > 0 && embd % heads === 0 ? embd / heads : 0);
  const linearKHeads = o.linearKHeads ?? heads;
  return {
    linearKHeads,
    linearVHeads: o.linearVHeads ?? 2 * linearKHeads,
    linearHeadDim: o.linearHeadDim ?? headDim,
    convKernel: o.convKernel ?? 4,
    fullAttnInterval: o.fullAttnInterval ?? 4,
    ropeDims: o.ropeDims ?? (isHybridArch(arch) ? headDim / 4 : headDim),
  };
}

function checkHybrid(r: ResolvedModelOptions): void {
  for (const k of ['linearKHeads', 'linearVHeads', 'linearHeadDim', 'convKernel', 'fullAttnInterval'] as const) {
    if (!Number.isSafeInteger(r[k]) || r[k] < 1) throw badOption(`${k} must be a positive integer, got ${r[k]}`);
  }
  if (!Number.isSafeInteger(r.ropeDims) || r.ropeDims < 2 || r.ropeDims % 2 !== 0 || r.ropeDims > r.headDim) {
    throw badOption(`rope-dims must be even, at least 2 and at most the head size ${r.headDim}, got ${r.ropeDims}`);
  }
  if (r.linearVHeads % r.linearKHeads !== 0) throw badOption(`linear-v-heads ${r.linearVHeads} must be a multiple of linear-k-heads ${r.linearKHeads}`);
}

/** The GGUF spec of a synthetic model; tensor data is produced lazily when written. */
export function syntheticModelSpec(options: MakeModelOptions): GgufSpec {
  const o = resolveModelOptions(options);
  const { arch, headDim } = o;
  const tensors = isHybridArch(arch) ? modelTensors(o, hybridLayerTensors) : modelTensors(o);
  const vocab = buildVocab({ kind: o.tokenizer, vocabSize: o.vocab, ...(o.pre ? { pre: o.pre } : {}) });
  const isQwen = arch.startsWith('qwen');
  const u32 = (key: string, value: number): MetadataEntry => ({ key, type: 'uint32', value });
  const f32 = (key: string, value: number): MetadataEntry => ({ key, type: 'float32', value });
  const metadata: MetadataEntry[] = [
    { key: 'general.architecture', type: 'string', value: arch },
    // "phi 3", not "phi3": llama.cpp's vocab loader keys Phi-3 token attributes (and tokens our vocabulary lacks) on that name
    { key: 'general.name', type: 'string', value: `gguf-mesh synthetic ${arch === 'phi3' ? 'phi 3' : arch} ${o.layers}x${o.embd} ${o.type} seed ${o.seed}` },
    u32('general.file_type', FILE_TYPE[o.type]),
    u32('general.quantization_version', 2),
    u32('general.alignment', 32),
    u32(`${arch}.context_length`, o.ctx),
    u32(`${arch}.embedding_length`, o.embd),
    u32(`${arch}.block_count`, o.layers),
    u32(`${arch}.feed_forward_length`, o.ffn),
    u32(`${arch}.attention.head_count`, o.heads),
    u32(`${arch}.attention.head_count_kv`, o.kvHeads),
    u32(`${arch}.attention.key_length`, headDim),
    u32(`${arch}.attention.value_length`, headDim),
    u32(`${arch}.rope.dimension_count`, o.ropeDims),
    f32(`${arch}.rope.freq_base`, isQwen || arch === 'gemma3' ? 1_000_000 : 10_000),
    f32(`${arch}.attention.layer_norm_rms_epsilon`, isQwen ? 1e-6 : 1e-5),
    u32(`${arch}.vocab_size`, o.vocab),
    ...archMetadata(o),
    ...vocab.metadata,
  ];
  return { metadata, tensors, headerOnly: o.headerOnly };
}

/** The keys only some architectures or options write: experts, sliding window, rope scaling. */
function archMetadata(o: ResolvedModelOptions): MetadataEntry[] {
  const { arch } = o;
  const u32 = (key: string, value: number): MetadataEntry => ({ key: `${arch}.${key}`, type: 'uint32', value });
  const f32 = (key: string, value: number): MetadataEntry => ({ key: `${arch}.${key}`, type: 'float32', value });
  const out: MetadataEntry[] = [];
  if (isHybridArch(arch)) out.push(...hybridMetadata(o));
  else if (MOE_ARCHS.includes(arch)) {
    out.push(u32('expert_count', o.experts), u32('expert_used_count', o.expertsUsed), u32('expert_feed_forward_length', o.expertFfn));
    if (arch === 'qwen2moe') out.push(u32('expert_shared_feed_forward_length', o.sharedFfn));
  }
  if (arch === 'gemma3' && o.slidingWindow > 0) {
    out.push(u32('attention.sliding_window', o.slidingWindow), u32('attention.sliding_window_pattern', o.swaPattern), f32('rope.freq_base_swa', 10_000));
  }
  if (o.ropeScaling !== 'none') {
    out.push({ key: `${arch}.rope.scaling.type`, type: 'string', value: o.ropeScaling }, f32('rope.scaling.factor', o.ropeFactor));
  }
  if (o.ropeScaling === 'yarn' || arch === 'phi3') out.push(u32('rope.scaling.original_context_length', o.ropeOrigCtx));
  // Phi-3's LongRoPE magnitude factor, √(1 + ln(scale) / ln(original context)) for scale 4
  if (arch === 'phi3') out.push(f32('rope.scaling.attn_factor', Math.sqrt(1 + Math.log(4) / Math.log(o.ropeOrigCtx))));
  return out;
}

/** Builds a synthetic model in memory (small models; use makeModelFile for big ones). */
export function makeModel(options: MakeModelOptions): Uint8Array {
  return writeGguf(syntheticModelSpec(options));
}

/** Streams a synthetic model to `path`, holding one row group of one tensor at a time. */
export function makeModelFile(path: string, options: MakeModelOptions): Promise<WrittenLayout> {
  return writeGgufFile(path, syntheticModelSpec(options));
}

/** The layout (sizes, offsets) a model would have, without drawing any weights. */
export function planModel(options: MakeModelOptions): WrittenLayout {
  return planGguf(syntheticModelSpec(options));
}
