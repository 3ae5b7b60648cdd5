// The weights of one shard, as the CPU engine computes with them: norms and biases as f32
// vectors, projection matrices as `Matrix` (dense f32, or the file's quantised bytes with
// rows dequantised tile by tile while multiplying).

import { MeshError } from '../../errors.ts';
import { canDequantize, dequantize, dequantizeRow } from '../../gguf/dequant.ts';
import { F16_TABLE } from '../../gguf/fp16.ts';
import { GgmlType, TYPE_TRAITS, typeName } from '../../gguf/types.ts';
import type { TensorInfo, TensorSource } from '../../gguf/types.ts';
import type { ModelConfig } from '../../model/config.ts';
import { OUTPUT_NORM_TENSOR, OUTPUT_TENSOR, TOKEN_EMBD_TENSOR, shardHasEmbedding, shardHasHead, shardTensors } from '../shard.ts';
import type { ShardRange } from '../types.ts';
import { activationFormatFor, roundActivations } from './act-round.ts';
import type { ActivationFormat } from './act-round.ts';
import { matmulRows } from './ops.ts';
import { tryWasmArena } from './wasm-matmul.ts';
import type { WasmArena } from './wasm-matmul.ts';
import { loadLayer } from './layer-weights.ts';
import { isQ8_1Type, Q8_1Matrix } from './q8-1-matrix.ts';
import type { Matrix } from './matrix.ts';
import { loadHybridLayer } from './hybrid-layer.ts';
import type { HybridLayerWeights } from './hybrid-layer.ts';
import type { LayerWeights, TensorLoader } from './layer-weights.ts';

export type { LayerWeights } from './layer-weights.ts';
export type { Matrix } from './matrix.ts';

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

/** Weight rows dequantised per tile when multiplying a quantised matrix. */
const TILE_ROWS = 16;

class DenseMatrix implements Matrix {
  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    /** [rows × cols] f32, inside `arena` when there is one */
    readonly data: Float32Array,
    /** how activations are rounded before multiplying */
    readonly activation: ActivationFormat,
    /** the WebAssembly SIMD arena holding `data`, or null for the JS loop */
    readonly arena: WasmArena | null,
  ) {}
  get bytes(): number {
    return this.data.byteLength;
  }
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    const xr = roundActivations(x, nTokens, this.cols, this.activation);
    if (this.arena) this.arena.matmul(y, xr, this.data, nTokens, this.cols, this.rows);
    else matmulRows(y, xr, this.data, nTokens, this.cols, this.rows, 0, this.rows, 0);
  }
  row(r: number, out: Float32Array, outOffset: number): void {
    out.set(this.data.subarray(r * this.cols, (r + 1) * this.cols), outOffset);
  }
}

class QuantizedMatrix implements Matrix {
  private readonly rowBytes: number;
  private readonly tile: Float32Array; // [TILE_ROWS × cols] f32 scratch

  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    readonly type: GgmlType,
    /** the tensor's bytes as stored in the file: rows × rowBytes */
    readonly data: Uint8Array,
    readonly activation: ActivationFormat,
  ) {
    const t = TYPE_TRAITS[type]!;
    this.rowBytes = (cols / t.blockSize) * t.typeSize;
    this.tile = new Float32Array(TILE_ROWS * cols);
  }
  get bytes(): number {
    return this.data.byteLength;
  }
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    const xr = roundActivations(x, nTokens, this.cols, this.activation);
    for (let r0 = 0; r0 < this.rows; r0 += TILE_ROWS) {
      const r1 = Math.min(r0 + TILE_ROWS, this.rows);
      dequantizeRow(this.type, this.data, r0 * this.rowBytes, (r1 - r0) * this.cols, this.tile, 0);
      matmulRows(y, xr, this.tile, nTokens, this.cols, this.rows, r0, r1, 0);
    }
  }
  row(r: number, out: Float32Array, outOffset: number): void {
    dequantizeRow(this.type, this.data, r * this.rowBytes, this.cols, out, outOffset);
  }
}

/** int8 weights with an f32 scale per 32-block, in a WasmArena; activations quantised to Q8_0. */
class Int8Matrix implements Matrix {
  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    /** [rows × cols] int8 */
    readonly q: Int8Array,
    /** [rows × cols/32] f32 (the f16 block scales, widened) */
    readonly d: Float32Array,
    readonly arena: WasmArena,
  ) {}
  get bytes(): number {
    return this.q.byteLength + this.d.byteLength;
  }
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    this.arena.matmulQ8(y, x, this.q, this.d, nTokens, this.cols, this.rows);
  }
  row(r: number, out: Float32Array, outOffset: number): void {
    const o = r * this.cols;
    for (let j = 0; j < this.cols; j++) out[outOffset + j] = this.q[o + j]! * this.d[(o + j) >> 5]!;
  }
}

/** Widens Q8_0 / Q4_0 bytes into int8 values and f32 block scales. */
function unpackInt8(type: GgmlType, raw: Uint8Array, n: number, q: Int8Array, d: Float32Array): void {
  const blockBytes = type === GgmlType.Q8_0 ? 34 : 18;
  for (let b = 0; b < n / 32; b++) {
    const o = b * blockBytes;
    d[b] = F16_TABLE[raw[o]! | (raw[o + 1]! << 8)]!;
    if (type === GgmlType.Q8_0) {
      for (let j = 0; j < 32; j++) q[b * 32 + j] = (raw[o + 2 + j]! << 24) >> 24;
    } else {
      for (let j = 0; j < 16; j++) {
        const v = raw[o + 2 + j]!;
        q[b * 32 + j] = (v & 0x0f) - 8;
        q[b * 32 + j + 16] = (v >> 4) - 8;
      }
    }
  }
}

/**
 * One matrix of `rows` × `cols` from its GGUF bytes, kept as `storage` says: the file's blocks
 * ('quantized'), int8 with block scales (`int8`, in `arena`), Q4_1/Q5_1 split for Q8_1
 * activations, or dense f32 (in `arena` when there is one).
 */
export function makeMatrix(
  label: string,
  type: GgmlType,
  raw: Uint8Array,
  rows: number,
  cols: number,
  o: { storage: WeightStorage; rounding: ActivationRounding; arena: WasmArena | null; int8: boolean },
): Matrix {
  const n = rows * cols;
  const activation = o.rounding === 'ggml' ? activationFormatFor(type) : 'f32';
  const arena = o.arena;
  if (o.storage === 'quantized' && type !== GgmlType.F32) return new QuantizedMatrix(label, rows, cols, type, raw, activation);
  if (o.int8 && rows % 4 !== 0) return new DenseMatrix(label, rows, cols, dequantize(type, raw, n), activation, null);
  if (arena?.hasInt8 && o.int8) {
    const q = arena.allocInt8(n); // [rows × cols] int8
    const d = arena.alloc(n / 32); // [rows × cols/32] f32
    unpackInt8(type, raw, n, q, d);
    return new Int8Matrix(label, rows, cols, q, d, arena);
  }
  if (o.rounding === 'ggml' && isQ8_1Type(type)) return Q8_1Matrix.fromBlocks(label, type, raw, rows, cols, arena ? arena.alloc(n) : null, arena);
  if (arena) {
    const view = arena.alloc(n); // [rows × cols] f32
    dequantizeRow(type, raw, 0, n, view, 0);
    return new DenseMatrix(label, rows, cols, view, activation, arena);
  }
  return new DenseMatrix(label, rows, cols, dequantize(type, raw, n), activation, null);
}

/** Whether makeMatrix keeps this type as int8 (Q8_0 and Q4_0 with SIMD and ggml rounding). */
export function keepsInt8(type: GgmlType, cols: number, rows: number, storage: WeightStorage, rounding: ActivationRounding, simd: boolean): boolean {
  return storage === 'auto' && rounding === 'ggml' && simd && INT8_TYPES.has(type) && cols % 32 === 0 && rows % 4 === 0;
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

  // matrices go into one WebAssembly arena, sized up front (it never grows)
  const asInt8 = (type: GgmlType, cols: number, rows: number) => keepsInt8(type, cols, rows, storage, rounding, simd);
  // (1-D tensors too, small: qwen2moe's shared-expert gate is multiplied as a 1-row matrix;
  // every expert of a 3-D tensor is its own allocation, so each gets its alignment slack)
  const arenaBytes = infos
    .filter((t) => storage !== 'quantized' || t.type === GgmlType.F32)
    .reduce((sum, t) => {
      const pieces = (t.shape[2] ?? 1) * 3; // experts, or fused q|k|v and gate|up
      return sum + (asInt8(t.type, t.shape[0]!, t.shape[1] ?? 1) ? t.nElements + t.nElements / 8 : t.nElements * 4) + 32 * pieces;
    }, 0);
  const arena = simd && arenaBytes > 0 ? tryWasmArena(arenaBytes) : null;

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
    // sized above as int8 when the tensor's ne1 rows suit the kernel; a piece of it that does not goes to the JS heap
    const m = makeMatrix(label, t.type, raw, rows, cols, { storage, rounding, arena, int8: asInt8(t.type, cols, t.shape[1] ?? 1) });
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
  return { layerStart: shard.start, tokenEmbd, layers, outputNorm, output, bytes };
}
