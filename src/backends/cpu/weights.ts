// The weights of one shard, as the CPU engine computes with them: norms and biases as f32
// vectors, projection matrices as `Matrix` (./matrices.ts: dense f32 or int8 in the engine's
// WasmArena, or the file's quantised bytes with rows dequantised tile by tile while multiplying).

import { MeshError } from '../../errors.ts';
import { canDequantize, dequantize, dequantizeRow } from '../../gguf/dequant.ts';
import { GgmlType, TYPE_TRAITS, typeName } from '../../gguf/types.ts';
import type { TensorInfo, TensorSource } from '../../gguf/types.ts';
import type { ModelConfig } from '../../model/config.ts';
import { OUTPUT_NORM_TENSOR, OUTPUT_TENSOR, TOKEN_EMBD_TENSOR, shardHasEmbedding, shardHasHead, shardTensors } from '../shard.ts';
import type { ShardRange } from '../types.ts';
import { activationFormatFor } from './act-round.ts';
import { DenseMatrix, Int8Matrix, QuantizedMatrix, packInt8 } from './matrices.ts';
import type { Matrix } from './matrices.ts';
import { MAX_ARENA_BYTES, WasmArena, wasmSimdAvailable } from './wasm-arena.ts';
import type { ArenaOptions } from './wasm-arena.ts';

export type { Matrix } from './matrices.ts';

/**
 * How matrices are kept in memory. 'auto' (default): Q8_0 and Q4_0 as 8-bit integers with a
 * scale per 32-block (int8 SIMD kernel, 1.1 bytes per weight), everything else as dense f32
 * (f32 SIMD kernel). 'f32': every matrix dense f32. 'quantized': as stored in the file, rows
 * dequantised tile by tile in JS (smallest, slowest).
 */
export type WeightStorage = 'auto' | 'f32' | 'quantized';

/** Types whose blocks are exactly int8 × one scale per 32 elements. */
const INT8_TYPES = new Set<GgmlType>([GgmlType.Q8_0, GgmlType.Q4_0]);

/**
 * 'ggml' (default): round activations as llama.cpp does before multiplying by a quantised or
 * f16 weight (see ./act-round.ts), so results agree with it to ~1e-5; 'none': exact f32.
 */
export type ActivationRounding = 'ggml' | 'none';

/**
 * The most staging any of the matrices needs. Made outside loadShardWeights on purpose: a closure
 * made there would keep that scope's context, and with it every tensor's file bytes, alive.
 */
function stagingOf(matrices: readonly Matrix[]): (nTokens: number) => number {
  return (n) => Math.max(0, ...matrices.map((m) => m.staging(n)));
}

export interface LayerWeights {
  attnNorm: Float32Array; // [nEmbd]
  wq: Matrix; // [nHead·headDim × nEmbd]
  wk: Matrix; // [nHeadKv·headDim × nEmbd]
  wv: Matrix; // [nHeadKv·headDim × nEmbd]
  wo: Matrix; // [nEmbd × nHead·headDim]
  bq: Float32Array | null; // [nHead·headDim] (qwen2)
  bk: Float32Array | null; // [nHeadKv·headDim]
  bv: Float32Array | null; // [nHeadKv·headDim]
  qNorm: Float32Array | null; // [headDim] (qwen3)
  kNorm: Float32Array | null; // [headDim]
  ffnNorm: Float32Array; // [nEmbd]
  wGate: Matrix; // [nFf × nEmbd]
  wUp: Matrix; // [nFf × nEmbd]
  wDown: Matrix; // [nEmbd × nFf]
}

export interface ShardWeights {
  /** token embedding [nVocab × nEmbd], when the shard starts at layer 0 */
  tokenEmbd: Matrix | null;
  /** layers [shard.start, shard.end), index 0 = shard.start */
  layers: LayerWeights[];
  /** output norm [nEmbd] and head [nVocab × nEmbd], when the shard ends at the last layer */
  outputNorm: Float32Array | null;
  output: Matrix | null;
  /** bytes held in memory */
  bytes: number;
  /** the memory the matrices, KV caches and activations live in */
  arena: WasmArena;
  /** bytes of arena staging the layers' matmuls need for nTokens (the most any one needs) */
  staging(nTokens: number): number;
}

/**
 * Reads exactly the shard's tensors from `source` and turns them into ShardWeights.
 * Unsupported tensor types fail before anything is read (UNSUPPORTED_TENSOR_TYPE, naming the
 * tensor and its type).
 */
export async function loadShardWeights(
  source: TensorSource,
  config: ModelConfig,
  shard: ShardRange,
  storage: WeightStorage,
  rounding: ActivationRounding = 'ggml',
  simd = true,
  arenaOptions: Omit<ArenaOptions, 'simd'> = {},
): Promise<ShardWeights> {
  const infos = shardTensors(source.header, shard, config.nLayer);
  for (const t of infos) {
    if (!canDequantize(t.type)) {
      throw new MeshError('UNSUPPORTED_TENSOR_TYPE', `tensor ${t.name} has type ${typeName(t.type)}, which the CPU engine cannot dequantise`, {
        tensor: t.name,
        type: typeName(t.type),
      });
    }
  }
  const byName = new Map(infos.map((t) => [t.name, t]));
  const data = await source.read(infos);

  const info = (name: string): TensorInfo => {
    const t = byName.get(name);
    if (!t) throw new MeshError('TENSOR_MISSING', `${source.location} has no tensor ${name}`);
    return t;
  };
  const optional = (name: string): TensorInfo | undefined => byName.get(name);

  const vector = (name: string, length: number): Float32Array => {
    const t = info(name);
    if (t.nElements !== length) {
      throw new MeshError('BAD_TENSOR_SHAPE', `${name} has ${t.nElements} elements, expected ${length}`);
    }
    return dequantize(t.type, data.get(name)!, t.nElements);
  };
  const optionalVector = (name: string, length: number): Float32Array | null => (optional(name) ? vector(name, length) : null);

  // matrices go into one WebAssembly memory, sized up front for them (it grows for KV caches)
  const int8Ok = storage === 'auto' && rounding === 'ggml' && simd && wasmSimdAvailable();
  const asInt8 = (t: TensorInfo) => int8Ok && INT8_TYPES.has(t.type) && t.shape[0]! % 32 === 0 && t.shape[1]! % 4 === 0;
  const arenaBytes = (s: WeightStorage) =>
    infos
      .filter((t) => t.shape.length === 2 && (s !== 'quantized' || t.type === GgmlType.F32))
      .reduce((sum, t) => sum + (asInt8(t) ? (t.nElements * 9) / 8 + 16 : t.nElements * 4 + 16), 0);
  // weights too large for one WebAssembly memory stay as the file's blocks, dequantised per tile
  if (storage !== 'quantized' && arenaBytes(storage) > MAX_ARENA_BYTES / 2) storage = 'quantized';
  const arena = new WasmArena(arenaBytes(storage) + (1 << 20), { ...arenaOptions, simd });

  let bytes = 0;
  const made = new Map<string, Matrix>();
  const matrix = (name: string, cols: number, rows: number): Matrix => {
    const done = made.get(name);
    if (done) return done;
    const t = info(name);
    if (t.shape.length !== 2 || t.shape[0] !== cols || t.shape[1] !== rows) {
      throw new MeshError('BAD_TENSOR_SHAPE', `${name} has shape [${t.shape.join(', ')}], expected [${cols}, ${rows}]`);
    }
    const raw = data.get(name)!;
    const activation = rounding === 'ggml' ? activationFormatFor(t.type) : 'f32';
    let m: Matrix;
    if (storage === 'quantized' && t.type !== GgmlType.F32) {
      m = new QuantizedMatrix(name, rows, cols, t.type, raw, activation, arena);
    } else if (asInt8(t)) {
      const w = arena.alloc((t.nElements * 9) / 8); // Q8x4: rows/4 × cols/32 blocks of 144 bytes
      packInt8(t.type, raw, rows, cols, arena.bytes, arena.heap, w);
      m = new Int8Matrix(name, rows, cols, w, arena);
    } else {
      const w = arena.alloc(t.nElements * 4); // [rows × cols] f32
      dequantizeRow(t.type, raw, 0, t.nElements, arena.heap, w >> 2);
      m = new DenseMatrix(name, rows, cols, w, activation, arena);
    }
    made.set(name, m);
    bytes += m.bytes;
    return m;
  };

  const { nEmbd, nFf, headDim } = config;
  const qDim = config.nHead * headDim;
  const kvDim = config.nHeadKv * headDim;
  const layers: LayerWeights[] = [];
  for (let il = shard.start; il < shard.end; il++) {
    const p = `blk.${il}.`;
    if (optional(`${p}attn_qkv.weight`)) {
      throw new MeshError('UNSUPPORTED_TENSOR_LAYOUT', `${p}attn_qkv.weight (fused QKV) is not supported`);
    }
    layers.push({
      attnNorm: vector(`${p}attn_norm.weight`, nEmbd),
      wq: matrix(`${p}attn_q.weight`, nEmbd, qDim),
      wk: matrix(`${p}attn_k.weight`, nEmbd, kvDim),
      wv: matrix(`${p}attn_v.weight`, nEmbd, kvDim),
      wo: matrix(`${p}attn_output.weight`, qDim, nEmbd),
      bq: config.qkvBias ? vector(`${p}attn_q.bias`, qDim) : optionalVector(`${p}attn_q.bias`, qDim),
      bk: config.qkvBias ? vector(`${p}attn_k.bias`, kvDim) : optionalVector(`${p}attn_k.bias`, kvDim),
      bv: config.qkvBias ? vector(`${p}attn_v.bias`, kvDim) : optionalVector(`${p}attn_v.bias`, kvDim),
      qNorm: config.qkNorm ? vector(`${p}attn_q_norm.weight`, headDim) : null,
      kNorm: config.qkNorm ? vector(`${p}attn_k_norm.weight`, headDim) : null,
      ffnNorm: vector(`${p}ffn_norm.weight`, nEmbd),
      wGate: matrix(`${p}ffn_gate.weight`, nEmbd, nFf),
      wUp: matrix(`${p}ffn_up.weight`, nEmbd, nFf),
      wDown: matrix(`${p}ffn_down.weight`, nFf, nEmbd),
    });
  }

  const tokenEmbd = shardHasEmbedding(shard) ? matrix(TOKEN_EMBD_TENSOR, nEmbd, config.nVocab) : null;
  let outputNorm: Float32Array | null = null;
  let output: Matrix | null = null;
  if (shardHasHead(shard, config.nLayer)) {
    outputNorm = vector(OUTPUT_NORM_TENSOR, nEmbd);
    output = config.tiedEmbeddings
      ? (tokenEmbd ?? matrix(TOKEN_EMBD_TENSOR, nEmbd, config.nVocab))
      : matrix(OUTPUT_TENSOR, nEmbd, config.nVocab);
  }
  return { tokenEmbd, layers, outputNorm, output, bytes, arena, staging: stagingOf([...made.values()]) };
}
