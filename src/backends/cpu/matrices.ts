// A shard's weight matrices as the CPU engine multiplies them, all inside the WasmArena:
// dense f32, int8 with a scale per 32-block (Q8_0 as stored, Q4_0 widened), or the file's
// quantised bytes dequantised 16 rows at a time into the arena. Inputs and outputs that are
// views into the arena (the forward pass's activations) are used in place; others are staged.

import { dequantizeRow } from '../../gguf/dequant.ts';
import { F16_TABLE } from '../../gguf/fp16.ts';
import { GgmlType, TYPE_TRAITS } from '../../gguf/types.ts';
import { KERNEL_IDS, piecesFor, rowCallCount, rowCalls } from './compute-pool.ts';
import { quantizeRowsQ8_0, roundActivations } from './act-round.ts';
import type { ActivationFormat } from './act-round.ts';
import type { WasmArena } from './wasm-arena.ts';
import { Q8X4_BLOCK_BYTES, q8Scratch } from './wasm-q8.ts';
import type { Matrix } from './matrix.ts';

export type { Matrix } from './matrix.ts';

/** Weight rows dequantised per tile when multiplying a quantised matrix. */
const TILE_ROWS = 16;

/** Where x and y of one matmul live: arena byte offsets (staged copies for arrays outside it). */
interface Io {
  x: number;
  y: number;
  /** copies a staged y back to the caller's array */
  finish(): void;
}

/**
 * Offsets for x ([n × cols] f32, or `xBytes` of anything) and y ([n × rows] f32). Offsets of
 * arena views are taken before staging can grow the memory (which detaches unshared views).
 */
function io(arena: WasmArena, y: Float32Array, yFloats: number, x: Float32Array, xFloats: number, extra = 0): Io & { extra: number } {
  let xOff = arena.offsetOf(x);
  let yOff = arena.offsetOf(y);
  const xStage = xOff < 0 ? Math.ceil(xFloats / 4) * 16 : 0;
  const yStage = yOff < 0 ? Math.ceil(yFloats / 4) * 16 : 0;
  const base = arena.staging(xStage + yStage + extra);
  if (xOff < 0) {
    xOff = base;
    arena.heap.set(x.subarray(0, xFloats), xOff >> 2);
  }
  if (yOff < 0) yOff = base + xStage;
  const staged = yStage > 0;
  return {
    x: xOff,
    y: yOff,
    extra: base + xStage + yStage,
    finish: () => {
      if (staged) y.set(arena.f32(yOff, yFloats));
    },
  };
}

/** m.staging(n) plus copies of x and y, for a product whose x and y are arrays outside the arena */
export function stagingWithCopies(m: Matrix, nTokens: number): number {
  return m.staging(nTokens) + Math.ceil((nTokens * m.cols) / 4) * 16 + Math.ceil((nTokens * m.rows) / 4) * 16;
}

/** y[:, 0 … rows) = x · wᵀ for f32 w at byte offset `w` (rows × cols): the kernel on groups of 4 rows, JS on the rest. */
function mmDense(arena: WasmArena, w: number, rows: number, cols: number, yOff: number, ys: number, xOff: number, n: number): void {
  const rows4 = cols % 4 === 0 ? rows - (rows % 4) : 0;
  if (rows4 > 0) arena.run(rowCalls(KERNEL_IDS.mm_f32, rows4, piecesFor(arena.threads, rows4 * cols * n), (r0, r1) => [xOff, cols * 4, w, cols * 4, yOff, ys, cols, n, r0, r1]));
  if (rows4 < rows) arena.mmF32Js(xOff, cols * 4, w, cols * 4, yOff, ys, cols, n, rows4, rows);
}

export class DenseMatrix implements Matrix {
  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    /** byte offset of [rows × cols] f32 in the arena */
    readonly offset: number,
    /** how activations are rounded before multiplying */
    readonly activation: ActivationFormat,
    readonly arena: WasmArena,
  ) {}
  get bytes(): number {
    return this.rows * this.cols * 4;
  }
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    const xr = roundActivations(x, nTokens, this.cols, this.activation);
    const p = io(this.arena, y, nTokens * this.rows, xr, nTokens * this.cols);
    mmDense(this.arena, this.offset, this.rows, this.cols, p.y, this.rows * 4, p.x, nTokens);
    p.finish();
  }
  row(r: number, out: Float32Array, outOffset: number): void {
    out.set(this.arena.f32(this.offset + r * this.cols * 4, this.cols), outOffset);
  }
  staging(nTokens: number): number {
    return this.activation === 'f32' ? 0 : nTokens * this.cols * 4 + 16; // the rounded copy of x
  }
}

/** The file's quantised bytes (outside the arena), dequantised TILE_ROWS rows at a time into it. */
export class QuantizedMatrix implements Matrix {
  private readonly rowBytes: number;

  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    readonly type: GgmlType,
    /** the tensor's bytes as stored in the file: rows × rowBytes */
    readonly data: Uint8Array,
    readonly activation: ActivationFormat,
    readonly arena: WasmArena,
  ) {
    const t = TYPE_TRAITS[type]!;
    this.rowBytes = (cols / t.blockSize) * t.typeSize;
  }
  get bytes(): number {
    return this.data.byteLength;
  }
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    const xr = roundActivations(x, nTokens, this.cols, this.activation);
    const p = io(this.arena, y, nTokens * this.rows, xr, nTokens * this.cols, TILE_ROWS * this.cols * 4);
    const tile = p.extra; // [TILE_ROWS × cols] f32
    for (let r0 = 0; r0 < this.rows; r0 += TILE_ROWS) {
      const r1 = Math.min(r0 + TILE_ROWS, this.rows);
      dequantizeRow(this.type, this.data, r0 * this.rowBytes, (r1 - r0) * this.cols, this.arena.heap, tile >> 2);
      mmDense(this.arena, tile, r1 - r0, this.cols, p.y + r0 * 4, this.rows * 4, p.x, nTokens);
    }
    p.finish();
  }
  row(r: number, out: Float32Array, outOffset: number): void {
    dequantizeRow(this.type, this.data, r * this.rowBytes, this.cols, out, outOffset);
  }
  staging(nTokens: number): number {
    return (this.activation === 'f32' ? 0 : nTokens * this.cols * 4 + 16) + TILE_ROWS * this.cols * 4;
  }
}

/**
 * int8 weights with an f32 scale per 32-block, repacked four rows at a time (Q8x4, see
 * ./wasm-q8.ts); activations quantised to Q8_0 (ggml's rounding). rows: a multiple of 4.
 */
export class Int8Matrix implements Matrix {
  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    /** byte offset of the Q8x4 blocks: rows/4 groups × cols/32 blocks × 144 bytes */
    readonly w: number,
    readonly arena: WasmArena,
  ) {}
  get bytes(): number {
    return (this.rows * this.cols * 9) / 8;
  }
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    const { arena, cols, rows } = this;
    const n = nTokens;
    const xqBytes = Math.ceil((n * cols) / 8) * 16;
    const pieces = piecesFor(arena.threads, rows * cols * n);
    const scratch = q8Scratch(cols, n); // per call: each runs on one thread at a time
    const p = io(arena, y, n * rows, x, n * cols, xqBytes + (n * cols) / 8 + scratch * rowCallCount(rows, pieces));
    const xq = p.extra; // [n × cols] i16
    const xd = xq + xqBytes; // [n × cols/32] f32
    const wide = xd + (n * cols) / 8;
    if (arena.quantQ8) arena.quantQ8(p.x, (n * cols) / 32, xq, xd);
    else quantizeRowsQ8_0(arena.f32(p.x, n * cols), n, cols, arena.halves, xq >> 1, arena.heap, xd >> 2);
    arena.run(rowCalls(KERNEL_IDS.mm_q8, rows, pieces, (r0, r1, c) => [xq, cols * 2, xd, cols / 8, this.w, p.y, rows * 4, cols, n, r0, r1, wide + c * scratch]));
    p.finish();
  }
  staging(nTokens: number): number {
    // x as Q8_0 (i16 integers, f32 scales), and each call's widened row group
    const calls = rowCallCount(this.rows, piecesFor(this.arena.threads, this.rows * this.cols * nTokens));
    return Math.ceil((nTokens * this.cols) / 8) * 16 + (nTokens * this.cols) / 8 + q8Scratch(this.cols, nTokens) * calls;
  }
  row(r: number, out: Float32Array, outOffset: number): void {
    const nb = this.cols / 32;
    const group = this.w + (r >> 2) * nb * Q8X4_BLOCK_BYTES;
    const q = this.arena.bytes;
    const d = this.arena.heap;
    for (let b = 0; b < nb; b++) {
      const block = group + b * Q8X4_BLOCK_BYTES;
      const at = block + 32 * (r & 3);
      const scale = d[(block + 128 + 4 * (r & 3)) >> 2]!;
      for (let j = 0; j < 32; j++) out[outOffset + 32 * b + j] = q[at + j]! * scale;
    }
  }
}

/**
 * Writes Q8_0 / Q4_0 bytes (rows × cols, ggml's blocks: an f16 scale, then 32 int8 or 16
 * bytes of nibbles) into the Q8x4 layout at byte offset `w` of `bytes` (heap: the same memory as f32).
 */
export function packInt8(type: GgmlType, raw: Uint8Array, rows: number, cols: number, bytes: Int8Array, heap: Float32Array, w: number): void {
  const blockBytes = type === GgmlType.Q8_0 ? 34 : 18;
  const nb = cols / 32;
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < nb; b++) {
      const o = (r * nb + b) * blockBytes;
      const block = w + ((r >> 2) * nb + b) * Q8X4_BLOCK_BYTES;
      const at = block + 32 * (r & 3);
      heap[(block + 128 + 4 * (r & 3)) >> 2] = F16_TABLE[raw[o]! | (raw[o + 1]! << 8)]!;
      if (type === GgmlType.Q8_0) {
        for (let j = 0; j < 32; j++) bytes[at + j] = (raw[o + 2 + j]! << 24) >> 24;
      } else {
        for (let j = 0; j < 16; j++) {
          const v = raw[o + 2 + j]!;
          bytes[at + j] = (v & 0x0f) - 8;
          bytes[at + j + 16] = (v >> 4) - 8;
        }
      }
    }
  }
}
