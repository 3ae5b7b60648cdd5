// The weights of one shard, as the CPU engine computes with them: norms and biases as f32
// vectors, projection matrices as `Matrix` (./matrices.ts: dense f32 or int8 in the engine's
// WasmArena, Q4_1/Q5_1 split for Q8_1 activations, or the file's quantised bytes with rows
// dequantised tile by tile while multiplying). Which tensors a layer has, for each
// architecture, is ./layer-weights.ts.

import { MeshError } from '../../errors.ts';
import { canDequantize, dequantize, dequantizeRow } from '../../gguf/dequant.ts';
import { GgmlType, TYPE_TRAITS, typeName } from '../../gguf/types.ts';
import type { TensorInfo, TensorSource } from '../../gguf/types.ts';
import type { ModelConfig } from '../../model/config.ts';
import { OUTPUT_NORM_TENSOR, OUTPUT_TENSOR, TOKEN_EMBD_TENSOR, shardHasEmbedding, shardHasHead, shardTensors } from '../shard.ts';
import type { ShardRange } from '../types.ts';
import { activationFormatFor } from './act-round.ts';
import { loadHybridLayer } from './hybrid-layer.ts';
import type { HybridLayerWeights } from './hybrid-layer.ts';
import { loadLayer } from './layer-weights.ts';
import type { LayerWeights, TensorLoader } from './layer-weights.ts';
import { DenseMatrix, Int8Matrix, QuantizedMatrix, packInt8, stagingWithCopies } from './matrices.ts';
import type { Matrix } from './matrix.ts';
import { isQ8_1Type, Q8_1Matrix } from './q8-1-matrix.ts';
import { MAX_ARENA_BYTES, WasmArena, wasmSimdAvailable } from './wasm-arena.ts';
import type { ArenaOptions } from './wasm-arena.ts';
import { Q8X4_BLOCK_BYTES, Q8_READ_AHEAD, q8x4Bytes } from './wasm-q8.ts';

export type { LayerWeights } from './layer-weights.ts';
export type { Matrix } from './matrix.ts';

/**
 * How matrices are kept in memory. 'auto' (default): Q8_0 and Q4_0 as 8-bit integers with a
 * scale per 32-block (int8 SIMD kernel, 1.1 bytes per weight), Q4_1/Q5_1 as d·q plus block
 * mins, everything else as dense f32 (f32 SIMD kernel). 'f32': every matrix dense f32.
 * 'quantized': as stored in the file, rows dequantised tile by tile (smallest, slowest).
 */
export type WeightStorage = 'auto' | 'f32' | 'quantized';

/** Types whose blocks are exactly int8 × one scale per 32 elements. */
const INT8_TYPES = new Set<GgmlType>([GgmlType.Q8_0, GgmlType.Q4_0]);

/**
 * 'ggml' (default): round activations as llama.cpp does before multiplying by a quantised or
 * f16 weight (see ./act-round.ts), so results agree with it to ~1e-5; 'none': exact f32.
 */
export type ActivationRounding = 'ggml' | 'none';

/** Whether makeMatrix keeps this type as int8 (Q8_0 and Q4_0 with SIMD and ggml rounding; rows in fours). */
export function keepsInt8(type: GgmlType, cols: number, rows: number, storage: WeightStorage, rounding: ActivationRounding, simd: boolean): boolean {
  return storage === 'auto' && rounding === 'ggml' && simd && INT8_TYPES.has(type) && cols % 32 === 0 && rows % 4 === 0;
}

/**
 * One matrix of `rows` × `cols` from its GGUF bytes, kept as `storage` says: the file's blocks
 * ('quantized'), int8 in the Q8x4 layout (`int8`), Q4_1/Q5_1 split for Q8_1 activations, or
 * dense f32 — all but the first in `arena`.
 */
export function makeMatrix(
  label: string,
  type: GgmlType,
  raw: Uint8Array,
  rows: number,
  cols: number,
  o: { storage: WeightStorage; rounding: ActivationRounding; arena: WasmArena; int8: boolean },
): Matrix {
  const n = rows * cols;
  const activation = o.rounding === 'ggml' ? activationFormatFor(type) : 'f32';
  const { arena } = o;
  if (o.storage === 'quantized' && type !== GgmlType.F32) return new QuantizedMatrix(label, rows, cols, type, raw, activation, arena);
  if (o.int8 && rows % 4 === 0 && cols % 32 === 0) {
    const w = arena.alloc(q8x4Bytes(rows, cols)); // Q8x4: rows/4 × cols/32 blocks of 144 bytes, then the kernel's read-ahead
    packInt8(type, raw, rows, cols, arena.bytes, arena.heap, w);
    return new Int8Matrix(label, rows, cols, w, arena);
  }
  if (o.rounding === 'ggml' && isQ8_1Type(type)) return Q8_1Matrix.fromBlocks(label, type, raw, rows, cols, arena);
  const w = arena.alloc(n * 4); // [rows × cols] f32
  dequantizeRow(type, raw, 0, n, arena.heap, w >> 2);
  return new DenseMatrix(label, rows, cols, w, activation, arena);
}

export interface ShardWeights {
  /** global index of layers[0] (= shard.start) */
  layerStart: number;
  /** token embedding [nVocab × nEmbd], when the shard starts at layer 0 */
  tokenEmbd: Matrix | null;
  /** layers [shard.start, shard.end), index 0 = shard.start */
  layers: (LayerWeights | HybridLayerWeights)[];
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
 * The most staging any of the matrices needs. Made outside loadShardWeights on purpose: a closure
 * made there would keep that scope's context, and with it every tensor's file bytes, alive.
 * Matrices in `copied` (a mixture of experts' own buffers live outside the arena) stage x and y
 * too, as does the head (one token's logits).
 */
function stagingOf(matrices: readonly Matrix[], copied: ReadonlySet<Matrix>, head: Matrix | null): (nTokens: number) => number {
  const headBytes = head ? stagingWithCopies(head, 1) : 0;
  return (n) => Math.max(headBytes, ...matrices.map((m) => (copied.has(m) ? stagingWithCopies(m, n) : m.staging(n))));
}

/** bytes the arena needs for the shard's tensors kept as `storage` (the sizes makeMatrix allocates) */
function arenaBytesFor(infos: readonly TensorInfo[], storage: WeightStorage, asInt8: (t: TensorInfo) => boolean): number {
  return infos
    .filter((t) => storage !== 'quantized' || t.type === GgmlType.F32)
    .reduce((sum, t) => {
      const pieces = (t.shape[2] ?? 1) * 3; // experts, or fused q|k|v and gate|up: each its own allocation
      return sum + (asInt8(t) ? (t.nElements * 9) / 8 + (Q8_READ_AHEAD + Q8X4_BLOCK_BYTES) * pieces : t.nElements * 4) + 16 * pieces;
    }, 0);
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
  const vector = (name: string, length: number): Float32Array => {
    const t = info(name);
    if (t.nElements !== length) {
      throw new MeshError('BAD_TENSOR_SHAPE', `${name} has ${t.nElements} elements, expected ${length}`);
    }
    return dequantize(t.type, data.get(name)!, t.nElements);
  };

  // matrices go into one WebAssembly memory, sized up front for them (it grows for KV caches)
  const int8Ok = simd && wasmSimdAvailable();
  const asInt8 = (t: TensorInfo) => keepsInt8(t.type, t.shape[0]!, t.shape[1] ?? 1, storage, rounding, int8Ok);
  // weights too large for one WebAssembly memory stay as the file's blocks, dequantised per tile
  if (storage !== 'quantized' && arenaBytesFor(infos, storage, asInt8) > MAX_ARENA_BYTES / 2) storage = 'quantized';
  const arena = new WasmArena(arenaBytesFor(infos, storage, asInt8) + (1 << 20), { ...arenaOptions, simd });

  let bytes = 0;
  const made = new Map<string, Matrix>();
  /** rows [row0, row0 + rows) of tensor `name` (rows of `cols` values) as a Matrix called `label` */
  const rowsOf = (name: string, cols: number, row0: number, rows: number, label: string): Matrix => {
    const done = made.get(label);
    if (done) return done;
    const t = info(name);
    const total = t.nElements / (t.shape[0] ?? 1);
    if (t.shape[0] !== cols || row0 + rows > total) {
      throw new MeshError('BAD_TENSOR_SHAPE', `${name} has shape [${t.shape.join(', ')}], expected rows of ${cols} and at least ${row0 + rows} rows`);
    }
    const rowBytes = (cols / TYPE_TRAITS[t.type]!.blockSize) * TYPE_TRAITS[t.type]!.typeSize;
    const raw = data.get(name)!.subarray(row0 * rowBytes, (row0 + rows) * rowBytes);
    // int8 when the tensor's ne1 rows suit the kernel; a piece of it whose rows do not is dense f32
    const m = makeMatrix(label, t.type, raw, rows, cols, { storage, rounding, arena, int8: asInt8(t) });
    made.set(label, m);
    bytes += m.bytes;
    return m;
  };
  const matrix = (name: string, cols: number, rows: number): Matrix => {
    const t = info(name);
    if (t.shape.length !== 2 || t.shape[0] !== cols || t.shape[1] !== rows) {
      throw new MeshError('BAD_TENSOR_SHAPE', `${name} has shape [${t.shape.join(', ')}], expected [${cols}, ${rows}]`);
    }
    return rowsOf(name, cols, 0, rows, name);
  };
  const loader: TensorLoader = {
    has: (name) => byName.has(name),
    vector,
    matrix,
    rows: rowsOf,
    experts: (name, cols, rows, nExpert) => {
      const t = info(name);
      if (t.shape.length !== 3 || t.shape[0] !== cols || t.shape[1] !== rows || t.shape[2] !== nExpert) {
        throw new MeshError('BAD_TENSOR_SHAPE', `${name} has shape [${t.shape.join(', ')}], expected [${cols}, ${rows}, ${nExpert}]`);
      }
      return Array.from({ length: nExpert }, (_, e) => rowsOf(name, cols, e * rows, rows, `${name}[${e}]`));
    },
  };

  const layers: (LayerWeights | HybridLayerWeights)[] = [];
  for (let il = shard.start; il < shard.end; il++) layers.push(config.linearAttention ? loadHybridLayer(loader, config, il) : loadLayer(loader, config, il));

  const tokenEmbd = shardHasEmbedding(shard) ? matrix(TOKEN_EMBD_TENSOR, config.nEmbd, config.nVocab) : null;
  let outputNorm: Float32Array | null = null;
  let output: Matrix | null = null;
  if (shardHasHead(shard, config.nLayer)) {
    outputNorm = vector(OUTPUT_NORM_TENSOR, config.nEmbd);
    output = config.tiedEmbeddings
      ? (tokenEmbd ?? matrix(TOKEN_EMBD_TENSOR, config.nEmbd, config.nVocab))
      : matrix(OUTPUT_TENSOR, config.nEmbd, config.nVocab);
  }
  const layerMatrices = [...made.values()].filter((m) => m !== tokenEmbd && m !== output);
  return { layerStart: shard.start, tokenEmbd, layers, outputNorm, output, bytes, arena, staging: stagingOf(layerMatrices, copiedMatrices(layers), output) };
}

/**
 * the matrices multiplied with buffers of their own, outside the arena: a mixture of experts'
 * (./ffn.ts) and a Qwen3.5 block's token mixer (./hybrid-layer.ts)
 */
function copiedMatrices(layers: readonly (LayerWeights | HybridLayerWeights)[]): Set<Matrix> {
  const out = new Set<Matrix>();
  for (const l of layers) {
    if ('mixer' in l) for (const m of Object.values(l.mixer)) if (typeof m === 'object' && 'matmul' in m) out.add(m as Matrix);
    if (l.ffn.kind !== 'moe') continue;
    for (const m of [l.ffn.router, ...l.ffn.gate, ...l.ffn.up, ...l.ffn.down]) out.add(m);
    if (l.ffn.shared) for (const m of [l.ffn.shared.gateInp, l.ffn.shared.ffn.wGate, l.ffn.shared.ffn.wUp, l.ffn.shared.ffn.wDown]) out.add(m);
  }
  return out;
}
