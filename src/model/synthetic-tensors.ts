// The tensors of a synthetic model, per architecture, with llama.cpp's names and shapes
// (src/models/<arch>.cpp `load_arch_tensors`), their ggml types for a model type (pure, or
// llama-quantize's Q4_K_M / Q5_K_M mixes), and the deterministic random values they hold.

import { MeshError } from '../errors.ts';
import { quantize } from '../gguf/quantize.ts';
import { GgmlType, TYPE_TRAITS } from '../gguf/types.ts';
import type { TensorSpec } from '../gguf/writer.ts';
import { Prng } from './prng.ts';

export const MODEL_TYPES = [
  'f32', 'f16', 'bf16', 'q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q2_k', 'q3_k', 'q4_k', 'q5_k', 'q6_k',
  'iq4_nl', 'iq4_xs', 'mxfp4', 'q4_k_m', 'q5_k_m',
] as const;
export type ModelType = (typeof MODEL_TYPES)[number];

/** What the tensor list depends on (synthetic-model.ts's resolved options). */
export interface TensorOptions {
  arch: string;
  layers: number;
  embd: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  ffn: number;
  vocab: number;
  type: ModelType;
  tied: boolean;
  seed: number;
  experts: number;
  expertFfn: number;
  sharedFfn: number;
  ropeFreqs: boolean;
}

const PURE_TYPE: Record<Exclude<ModelType, 'q4_k_m' | 'q5_k_m'>, GgmlType> = {
  f32: GgmlType.F32,
  f16: GgmlType.F16,
  bf16: GgmlType.BF16,
  q8_0: GgmlType.Q8_0,
  q4_0: GgmlType.Q4_0,
  q4_1: GgmlType.Q4_1,
  q5_0: GgmlType.Q5_0,
  q5_1: GgmlType.Q5_1,
  q2_k: GgmlType.Q2_K,
  q3_k: GgmlType.Q3_K,
  q4_k: GgmlType.Q4_K,
  q5_k: GgmlType.Q5_K,
  q6_k: GgmlType.Q6_K,
  iq4_nl: GgmlType.IQ4_NL,
  iq4_xs: GgmlType.IQ4_XS,
  mxfp4: GgmlType.MXFP4,
};

/** The ggml type every matrix of a pure model type has (the mixes: their base type). */
export function baseMatrixType(type: ModelType): GgmlType {
  if (type === 'q4_k_m') return GgmlType.Q4_K;
  if (type === 'q5_k_m') return GgmlType.Q5_K;
  return PURE_TYPE[type];
}

/** llama.cpp's use_more_bits: which layers the _M mixes give more bits (first/last eighth, every third). */
function useMoreBits(i: number, n: number): boolean {
  const e = Math.floor(n / 8);
  return i < e || i >= Math.floor((7 * n) / 8) || (i - e) % 3 === 2;
}

export type Role = 'token_embd' | 'output' | 'attn_q' | 'attn_k' | 'attn_v' | 'attn_qkv' | 'attn_output' | 'ffn_gate' | 'ffn_up' | 'ffn_down' | 'router';

/** The ggml type of a matrix for a model type (vectors are always F32; routers stay F32, as llama-quantize leaves them). */
export function matrixType(type: ModelType, role: Role, layer: number, nLayer: number, tied: boolean): GgmlType {
  if (role === 'router') return GgmlType.F32;
  if (type !== 'q4_k_m' && type !== 'q5_k_m') return PURE_TYPE[type];
  const base = baseMatrixType(type);
  // a tied token_embd doubles as the output head, so it gets the output's type
  if (role === 'output' || (role === 'token_embd' && tied)) return GgmlType.Q6_K;
  if ((role === 'attn_v' || role === 'ffn_down') && useMoreBits(layer, nLayer)) return GgmlType.Q6_K;
  if (role === 'attn_qkv') return type === 'q4_k_m' ? GgmlType.Q5_K : GgmlType.Q6_K;
  return base;
}

/** 32-bit FNV-1a of a string mixed with the seed: one independent stream per tensor. */
function streamSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** How a tensor's values are drawn: mean + std·normal (|·| when `abs`). */
export interface Init {
  mean: number;
  std: number;
  abs?: boolean;
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
      for (let i = 0; i < values.length; i++) {
        const r = init.std * rng.normal();
        values[i] = init.mean + (init.abs ? Math.abs(r) : r);
      }
      yield quantize(type, values, nPerRow);
    }
  };
}

/** Adds tensors to a list: matrices typed by role, vectors in F32. */
export class TensorList {
  readonly tensors: TensorSpec[] = [];
  constructor(private readonly o: TensorOptions) {}

  /** a weight [nIn, nOut] (or [nIn, nOut, nExpert]) drawn with std, typed for its role */
  matrix(name: string, role: Role, layer: number, shape: number[], std: number): void {
    const o = this.o;
    const type = matrixType(o.type, role, layer, o.layers, o.tied);
    const traits = TYPE_TRAITS[type]!;
    if (shape[0]! % traits.blockSize !== 0) {
      throw new MeshError(
        'MAKE_MODEL_BAD_SHAPE',
        `${name} has rows of ${shape[0]} values, which ${traits.name} (--type ${o.type}) cannot store: rows must be a multiple of ${traits.blockSize}; choose embd/ffn multiples of ${traits.blockSize}`,
      );
    }
    this.tensors.push({ name, type, shape, data: randomTensor(name, type, shape, { mean: 0, std }, o.seed) });
  }

  vector(name: string, n: number, init: Init): void {
    this.tensors.push({ name, type: GgmlType.F32, shape: [n], data: randomTensor(name, GgmlType.F32, [n], init, this.o.seed) });
  }
}

// Scales that keep activations sane and greedy output varied: each projection ~1/sqrt(fan_in)
// so outputs stay near unit size, norms near 1, and unit-size embeddings so the current token
// stays a large part of the residual stream (with 0.02-size embeddings the attention average
// dominates and random models repeat one token). A tied table is also the head, where
// unit-size rows make every token predict itself, so tied embeddings stay small.
const NORM: Init = { mean: 1, std: 0.02 };
const BIAS: Init = { mean: 0, std: 0.02 };
const proj = (nIn: number): number => 1 / Math.sqrt(nIn);

/** The tensors of block i for the options' architecture. */
export function layerTensors(list: TensorList, o: TensorOptions, i: number): void {
  const p = `blk.${i}.`;
  const { embd, headDim, arch } = o;
  const kvDim = headDim * o.kvHeads;
  const qDim = headDim * o.heads;
  list.vector(`${p}attn_norm.weight`, embd, NORM);
  if (arch === 'phi3') {
    list.matrix(`${p}attn_qkv.weight`, 'attn_qkv', i, [embd, qDim + 2 * kvDim], proj(embd));
  } else {
    list.matrix(`${p}attn_q.weight`, 'attn_q', i, [embd, qDim], proj(embd));
    list.matrix(`${p}attn_k.weight`, 'attn_k', i, [embd, kvDim], proj(embd));
    list.matrix(`${p}attn_v.weight`, 'attn_v', i, [embd, kvDim], proj(embd));
  }
  if (arch === 'qwen2' || arch === 'qwen2moe') {
    list.vector(`${p}attn_q.bias`, qDim, BIAS);
    list.vector(`${p}attn_k.bias`, kvDim, BIAS);
    list.vector(`${p}attn_v.bias`, kvDim, BIAS);
  }
  if (arch === 'qwen3' || arch === 'qwen3moe' || arch === 'gemma3') {
    // per-head RMS norms applied to q and k before RoPE
    list.vector(`${p}attn_q_norm.weight`, headDim, NORM);
    list.vector(`${p}attn_k_norm.weight`, headDim, NORM);
  }
  list.matrix(`${p}attn_output.weight`, 'attn_output', i, [qDim, embd], proj(qDim));
  if (arch === 'gemma3') list.vector(`${p}post_attention_norm.weight`, embd, NORM);
  list.vector(`${p}ffn_norm.weight`, embd, NORM);
  if (arch === 'qwen2moe' || arch === 'qwen3moe') {
    const ff = o.expertFfn;
    // router logits of a few units, so the top-k choice varies between tokens
    list.matrix(`${p}ffn_gate_inp.weight`, 'router', i, [embd, o.experts], 4 * proj(embd));
    list.matrix(`${p}ffn_gate_exps.weight`, 'ffn_gate', i, [embd, ff, o.experts], proj(embd));
    list.matrix(`${p}ffn_up_exps.weight`, 'ffn_up', i, [embd, ff, o.experts], proj(embd));
    list.matrix(`${p}ffn_down_exps.weight`, 'ffn_down', i, [ff, embd, o.experts], proj(ff));
    if (arch === 'qwen2moe') {
      list.vector(`${p}ffn_gate_inp_shexp.weight`, embd, { mean: 0, std: proj(embd) });
      list.matrix(`${p}ffn_gate_shexp.weight`, 'ffn_gate', i, [embd, o.sharedFfn], proj(embd));
      list.matrix(`${p}ffn_up_shexp.weight`, 'ffn_up', i, [embd, o.sharedFfn], proj(embd));
      list.matrix(`${p}ffn_down_shexp.weight`, 'ffn_down', i, [o.sharedFfn, embd], proj(o.sharedFfn));
    }
  } else if (arch === 'phi3') {
    // gate and up fused: rows [0, ffn) gate, [ffn, 2·ffn) up
    list.matrix(`${p}ffn_up.weight`, 'ffn_up', i, [embd, 2 * o.ffn], proj(embd));
    list.matrix(`${p}ffn_down.weight`, 'ffn_down', i, [o.ffn, embd], proj(o.ffn));
  } else {
    list.matrix(`${p}ffn_gate.weight`, 'ffn_gate', i, [embd, o.ffn], proj(embd));
    list.matrix(`${p}ffn_up.weight`, 'ffn_up', i, [embd, o.ffn], proj(embd));
    list.matrix(`${p}ffn_down.weight`, 'ffn_down', i, [o.ffn, embd], proj(o.ffn));
  }
  if (arch === 'gemma3') list.vector(`${p}post_ffw_norm.weight`, embd, NORM);
}

/** Every tensor of the model: embedding, blocks (`layer`: the architecture's), output norm and head, rope factor tables. */
export function modelTensors<O extends TensorOptions>(o: O, layer: (list: TensorList, o: O, i: number) => void = layerTensors): TensorSpec[] {
  const list = new TensorList(o);
  // gemma3 multiplies embeddings by √embd: draw them 1/√embd-sized so the scaled rows are unit-size
  list.matrix('token_embd.weight', 'token_embd', 0, [o.embd, o.vocab], o.tied ? 0.02 : o.arch === 'gemma3' ? proj(o.embd) : 1);
  for (let i = 0; i < o.layers; i++) layer(list, o, i);
  list.vector('output_norm.weight', o.embd, NORM);
  if (!o.tied) list.matrix('output.weight', 'output', o.layers, [o.embd, o.vocab], proj(o.embd));
  // llama3-style frequency factors (≥ 1: low frequencies slowed down) and Phi-3's short/long sets
  if (o.ropeFreqs) list.vector('rope_freqs.weight', o.headDim / 2, { mean: 1, std: 2, abs: true });
  if (o.arch === 'phi3') {
    list.vector('rope_factors_long.weight', o.headDim / 2, { mean: 1, std: 3, abs: true });
    list.vector('rope_factors_short.weight', o.headDim / 2, { mean: 1, std: 0.05, abs: true });
  }
  return list.tensors;
}
