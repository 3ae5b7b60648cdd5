// Random-weight GGUF models of any shape and quant type, with a real tokenizer, for tests and
// benchmarks. Tensor names, shapes and metadata keys are the ones llama.cpp loads for the
// `llama`, `qwen2` and `qwen3` architectures. Deterministic: every tensor draws from its own
// PRNG stream seeded by (seed, tensor name), so the same options give the same bytes however
// the file is produced (in memory, streamed, or chunked differently).
//
// Types: `f32` keeps everything F32; `f16`, `q8_0`, `q4_0`, `q4_k`, `q6_k` give every matrix
// that type (like llama-quantize --pure) with norms and biases F32; `q4_k_m` mixes Q4_K and
// Q6_K the way llama.cpp's Q4_K_M does (output, and attn_v/ffn_down of the layers its
// use_more_bits picks, in Q6_K; a tied token_embd is the output head, so Q6_K too). K-quant rows must be multiples of 256 values: instead of
// llama.cpp's silent fall-back to other types we refuse such shapes with a reason.

import { MeshError } from '../errors.ts';
import { Prng } from './prng.ts';
import { quantize } from '../gguf/quantize.ts';
import { GgmlType, TYPE_TRAITS } from '../gguf/types.ts';
import type { GgufSpec, MetadataEntry, TensorSpec, WrittenLayout } from '../gguf/writer.ts';
import { planGguf, writeGguf, writeGgufFile } from '../gguf/writer.ts';
import type { BpePre, TokenizerKind } from './synthetic-vocab.ts';
import { BPE_PRES, buildVocab, minVocabSize } from './synthetic-vocab.ts';

export const ARCHS = ['llama', 'qwen2', 'qwen3'] as const;
export type SyntheticArch = (typeof ARCHS)[number];
export const MODEL_TYPES = ['f32', 'f16', 'q8_0', 'q4_0', 'q4_k', 'q6_k', 'q4_k_m'] as const;
export type ModelType = (typeof MODEL_TYPES)[number];

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
}

export type ResolvedModelOptions = Required<Omit<MakeModelOptions, 'pre' | 'headerOnly'>> & { pre?: BpePre; headerOnly: boolean };

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

// llama_ftype values written to general.file_type (pure q4_k is written as "mostly Q4_K_S")
const FILE_TYPE: Record<ModelType, number> = { f32: 0, f16: 1, q4_0: 2, q8_0: 7, q4_k: 14, q4_k_m: 15, q6_k: 18 };
const PURE_TYPE: Record<Exclude<ModelType, 'q4_k_m'>, GgmlType> = {
  f32: GgmlType.F32,
  f16: GgmlType.F16,
  q8_0: GgmlType.Q8_0,
  q4_0: GgmlType.Q4_0,
  q4_k: GgmlType.Q4_K,
  q6_k: GgmlType.Q6_K,
};

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
    tokenizer: o.tokenizer ?? (arch === 'llama' ? 'llama' : 'gpt2'),
    headerOnly: o.headerOnly ?? false,
  };
  if (r.tokenizer !== 'llama' && r.tokenizer !== 'gpt2') throw badOption(`unknown tokenizer '${String(r.tokenizer)}' (known: llama, gpt2)`);
  if (o.pre !== undefined) {
    if (r.tokenizer !== 'gpt2') throw badOption(`--pre applies to the gpt2 tokenizer only`);
    if (!BPE_PRES.includes(o.pre)) throw badOption(`unknown pre-tokenizer '${o.pre}' (known: ${BPE_PRES.join(', ')})`);
  }
  if (r.tokenizer === 'gpt2') r.pre = o.pre ?? (arch === 'llama' ? 'llama-bpe' : 'qwen2');
  for (const k of ['layers', 'embd', 'heads', 'kvHeads', 'ffn', 'vocab', 'ctx'] as const) {
    if (!Number.isSafeInteger(r[k]) || r[k] < 1) throw badOption(`${k} must be a positive integer, got ${r[k]}`);
  }
  if (o.headDim !== undefined && (!Number.isSafeInteger(o.headDim) || o.headDim < 1)) throw badOption(`head-dim must be a positive integer, got ${o.headDim}`);
  if (!Number.isSafeInteger(r.seed) || r.seed < 0 || r.seed > 0xffffffff) throw badOption(`seed must be an integer in [0, 2^32), got ${r.seed}`);
  if (o.headDim === undefined && r.embd % r.heads !== 0) throw badOption(`embd ${r.embd} is not divisible by heads ${r.heads} (or give --head-dim)`);
  if (r.headDim % 2 !== 0) throw badOption(`head size ${r.headDim} must be even for RoPE`);
  // llama.cpp's qwen2 loader fixes attn_q/attn_output at [embd, embd]
  if (r.arch === 'qwen2' && r.headDim * r.heads !== r.embd) throw badOption(`qwen2 needs heads × head-dim = embd, got ${r.heads} × ${r.headDim} ≠ ${r.embd}`);
  if (r.kvHeads > r.heads || r.heads % r.kvHeads !== 0) throw badOption(`heads ${r.heads} must be a multiple of kv-heads ${r.kvHeads}`);
  const min = minVocabSize(r.tokenizer);
  if (r.vocab < min) throw badOption(`vocab ${r.vocab} is too small for the ${r.tokenizer} tokenizer: it needs at least ${min} tokens (specials, 256 bytes${r.tokenizer === 'llama' ? ', base characters' : ''})`);
  return r;
}

/** llama.cpp's use_more_bits: which layers Q4_K_M gives more bits (first/last eighth, every third). */
function useMoreBits(i: number, n: number): boolean {
  const e = Math.floor(n / 8);
  return i < e || i >= Math.floor((7 * n) / 8) || (i - e) % 3 === 2;
}

type Role = 'token_embd' | 'output' | 'attn_q' | 'attn_k' | 'attn_v' | 'attn_output' | 'ffn_gate' | 'ffn_up' | 'ffn_down';

/** The ggml type of a matrix for a model type (vectors are always F32). */
function matrixType(type: ModelType, role: Role, layer: number, nLayer: number, tied: boolean): GgmlType {
  if (type !== 'q4_k_m') return PURE_TYPE[type];
  // a tied token_embd doubles as the output head, so it gets the output's type
  if (role === 'output' || (role === 'token_embd' && tied)) return GgmlType.Q6_K;
  if ((role === 'attn_v' || role === 'ffn_down') && useMoreBits(layer, nLayer)) return GgmlType.Q6_K;
  return GgmlType.Q4_K;
}

// --- deterministic random numbers -------------------------------------------------------

/** 32-bit FNV-1a of a string mixed with the seed: one independent stream per tensor. */
function streamSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** How a tensor's values are drawn: mean + std·normal. */
interface Init {
  mean: number;
  std: number;
}

const ROW_CHUNK_VALUES = 1 << 20; // ~4 MiB of f32 per piece while streaming

/** A producer that draws a tensor's values row group by row group and quantises each group. */
function randomTensor(name: string, type: GgmlType, shape: number[], init: Init, seed: number): () => Iterable<Uint8Array> {
  return function* () {
    const rng = new Prng(streamSeed(seed, name));
    const nPerRow = shape[0]!;
    const nRows = shape.slice(1).reduce((a, b) => a * b, 1);
    const rowsPerChunk = Math.max(1, Math.floor(ROW_CHUNK_VALUES / nPerRow));
    for (let row = 0; row < nRows; row += rowsPerChunk) {
      const rows = Math.min(rowsPerChunk, nRows - row);
      const values = new Float32Array(rows * nPerRow); // [rows × nPerRow] f32
      for (let i = 0; i < values.length; i++) values[i] = init.mean + init.std * rng.normal();
      yield quantize(type, values, nPerRow);
    }
  };
}

// --- the model ----------------------------------------------------------------------------

/** The GGUF spec of a synthetic model; tensor data is produced lazily when written. */
export function syntheticModelSpec(options: MakeModelOptions): GgufSpec {
  const o = resolveModelOptions(options);
  const headDim = o.headDim;
  const kvDim = headDim * o.kvHeads;
  const qDim = headDim * o.heads;
  const arch = o.arch;
  const tensors: TensorSpec[] = [];

  const matrix = (name: string, role: Role, layer: number, nIn: number, nOut: number, std: number): void => {
    const type = matrixType(o.type, role, layer, o.layers, o.tied);
    const traits = TYPE_TRAITS[type]!;
    if (nIn % traits.blockSize !== 0) {
      throw new MeshError(
        'MAKE_MODEL_BAD_SHAPE',
        `${name} has rows of ${nIn} values, which ${traits.name} (--type ${o.type}) cannot store: rows must be a multiple of ${traits.blockSize}; choose embd/ffn multiples of ${traits.blockSize}`,
      );
    }
    const shape = [nIn, nOut];
    tensors.push({ name, type, shape, data: randomTensor(name, type, shape, { mean: 0, std }, o.seed) });
  };
  const vector = (name: string, n: number, init: Init): void => {
    tensors.push({ name, type: GgmlType.F32, shape: [n], data: randomTensor(name, GgmlType.F32, [n], init, o.seed) });
  };
  // Scales that keep activations sane and greedy output varied: each projection ~1/sqrt(fan_in)
  // so outputs stay near unit size, norms near 1, and unit-size embeddings so the current
  // token stays a large part of the residual stream (with 0.02-size embeddings the attention
  // average dominates and random models repeat one token). A tied table is also the head,
  // where unit-size rows make every token predict itself, so tied embeddings stay small.
  const norm: Init = { mean: 1, std: 0.02 };
  const bias: Init = { mean: 0, std: 0.02 };
  const proj = (nIn: number): number => 1 / Math.sqrt(nIn);

  matrix('token_embd.weight', 'token_embd', 0, o.embd, o.vocab, o.tied ? 0.02 : 1);
  for (let i = 0; i < o.layers; i++) {
    const p = `blk.${i}.`;
    vector(`${p}attn_norm.weight`, o.embd, norm);
    matrix(`${p}attn_q.weight`, 'attn_q', i, o.embd, qDim, proj(o.embd));
    matrix(`${p}attn_k.weight`, 'attn_k', i, o.embd, kvDim, proj(o.embd));
    matrix(`${p}attn_v.weight`, 'attn_v', i, o.embd, kvDim, proj(o.embd));
    if (arch === 'qwen2') {
      vector(`${p}attn_q.bias`, qDim, bias);
      vector(`${p}attn_k.bias`, kvDim, bias);
      vector(`${p}attn_v.bias`, kvDim, bias);
    }
    if (arch === 'qwen3') {
      // per-head RMS norms applied to q and k before RoPE
      vector(`${p}attn_q_norm.weight`, headDim, norm);
      vector(`${p}attn_k_norm.weight`, headDim, norm);
    }
    matrix(`${p}attn_output.weight`, 'attn_output', i, qDim, o.embd, proj(qDim));
    vector(`${p}ffn_norm.weight`, o.embd, norm);
    matrix(`${p}ffn_gate.weight`, 'ffn_gate', i, o.embd, o.ffn, proj(o.embd));
    matrix(`${p}ffn_up.weight`, 'ffn_up', i, o.embd, o.ffn, proj(o.embd));
    matrix(`${p}ffn_down.weight`, 'ffn_down', i, o.ffn, o.embd, proj(o.ffn));
  }
  vector('output_norm.weight', o.embd, norm);
  if (!o.tied) matrix('output.weight', 'output', o.layers, o.embd, o.vocab, proj(o.embd));

  const vocab = buildVocab({ kind: o.tokenizer, vocabSize: o.vocab, ...(o.pre ? { pre: o.pre } : {}) });
  const isQwen = arch !== 'llama';
  const u32 = (key: string, value: number): MetadataEntry => ({ key, type: 'uint32', value });
  const f32 = (key: string, value: number): MetadataEntry => ({ key, type: 'float32', value });
  const metadata: MetadataEntry[] = [
    { key: 'general.architecture', type: 'string', value: arch },
    { key: 'general.name', type: 'string', value: `gguf-mesh synthetic ${arch} ${o.layers}x${o.embd} ${o.type} seed ${o.seed}` },
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
    u32(`${arch}.rope.dimension_count`, headDim),
    f32(`${arch}.rope.freq_base`, isQwen ? 1_000_000 : 10_000),
    f32(`${arch}.attention.layer_norm_rms_epsilon`, isQwen ? 1e-6 : 1e-5),
    u32(`${arch}.vocab_size`, o.vocab),
    ...vocab.metadata,
  ];
  return { metadata, tensors, headerOnly: o.headerOnly };
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
