// One function per kernel: each turns shapes and buffers into a dispatch (uniform parameters
// in the order of the kernel's Params struct, bindings, workgroup counts) on a Recorder.
// Offsets and strides are in elements unless they say bytes.

import { f32, grid2d } from './kernels.ts';
import type { Recorder } from './kernels.ts';
import type { GpuMatrix } from './matrix.ts';
import type { KvType } from './shader-library.ts';

const WG = 64; // workgroup size of every kernel
const MUL_MAT_TOKENS = 4; // TN in mul_mat.wgsl
export const ATTENTION_CHUNK = 64; // CHUNK in attention_decode.wgsl
export const ATTENTION_MAX_HEAD_DIM = 256; // TILE × MAX_D_PER_THREAD in attention_prefill.wgsl

/** 'mul_mat_vec' reduces each row across a workgroup (good on GPUs); 'mul_mat' gives each
 * thread whole rows (no barriers: good where barriers are slow, like SwiftShader). */
export type MatVecKernel = 'mul_mat_vec' | 'mul_mat';

/** Batched kernel: 'mul_mat_tiled' (shared-memory tiles, for GPUs) or 'mul_mat' (no barriers). */
export type MatMulKernel = 'mul_mat' | 'mul_mat_tiled';

/**
 * What a matmul of several rows runs: a MatMulKernel (prefill), or 'decode': every row through
 * the decode kernel (`vecKernel`), which sums each row in the order it sums one alone — a batch
 * of sessions' decode steps, each row the bits of that session's own step.
 */
export type RowsKernel = MatMulKernel | 'decode';

const TILE_K = 32; // TK in mul_mat_tiled.wgsl
const TILE_ROWS = 64;
const TILE_TOKENS = 64;

/** Whether mul_mat_tiled can take a matrix with rows of k elements. */
export function tiledFits(k: number): boolean {
  return k % TILE_K === 0;
}

/**
 * out[t, outOffset + row] = W[row, :] · x[t, :] for t < nTokens.
 * x: [nTokens × w.k] from element xOffset; out rows are `outStride` apart.
 */
export function matmul(
  rec: Recorder,
  w: GpuMatrix,
  x: GPUBuffer,
  xOffset: number,
  out: GPUBuffer,
  outOffset: number,
  outStride: number,
  nTokens: number,
  vecKernel: MatVecKernel = 'mul_mat_vec',
  batchKernel: RowsKernel = 'mul_mat',
): void {
  for (const c of w.chunks) {
    if (nTokens > 1 && batchKernel === 'mul_mat_tiled' && tiledFits(w.k)) {
      rec.dispatch({
        kernel: 'mul_mat_tiled',
        quant: w.quant,
        reads: c.rows * w.rowBytes,
        params: [w.k, c.rows, w.rowBytes, nTokens, xOffset, w.k, outOffset + c.row0, outStride],
        buffers: [c.buffer, x, out],
        groups: [Math.ceil(c.rows / TILE_ROWS), Math.ceil(nTokens / TILE_TOKENS)],
      });
    } else if (vecKernel === 'mul_mat_vec' && (nTokens === 1 || batchKernel === 'decode')) {
      const [gx, gy] = grid2d(c.rows);
      rec.dispatch({
        kernel: 'mul_mat_vec',
        quant: w.quant,
        reads: c.rows * w.rowBytes,
        params: [w.k, c.rows, w.rowBytes, xOffset, outOffset + c.row0, gx, w.k, outStride],
        buffers: [c.buffer, x, out],
        groups: [gx, gy, nTokens],
      });
    } else {
      rec.dispatch({
        kernel: 'mul_mat',
        quant: w.quant,
        reads: c.rows * w.rowBytes,
        params: [w.k, c.rows, w.rowBytes, nTokens, xOffset, w.k, outOffset + c.row0, outStride],
        buffers: [c.buffer, x, out],
        groups: [Math.ceil(c.rows / WG), Math.ceil(nTokens / MUL_MAT_TOKENS)],
      });
    }
  }
}

/** rows a lookup of nTokens ids reads from a chunk of `rows` (at most one row per token) */
function chunkReads(nTokens: number, rows: number): number {
  return Math.min(nTokens, rows);
}

/** out[t, :] = row ids[t] of `table`, dequantised. ids: [nTokens] u32; out: [nTokens × k] */
export function getRows(rec: Recorder, table: GpuMatrix, ids: GPUBuffer, out: GPUBuffer, nTokens: number): void {
  const gx = Math.ceil(table.k / 4 / WG);
  for (const c of table.chunks) {
    rec.dispatch({
      kernel: 'get_rows',
      quant: table.quant,
      reads: chunkReads(nTokens, c.rows) * table.rowBytes,
      params: [table.k, c.rows, table.rowBytes, c.row0, nTokens, gx],
      buffers: [c.buffer, ids, out],
      groups: [gx, nTokens],
    });
  }
}

/** out rows = rmsnorm(x rows) * w. Rows of n elements; offsets/strides in elements. */
export function rmsNorm(
  rec: Recorder,
  x: GPUBuffer,
  inOffset: number,
  inStride: number,
  w: GPUBuffer,
  out: GPUBuffer,
  outOffset: number,
  outStride: number,
  n: number,
  nRows: number,
  eps: number,
): void {
  const [gx, gy] = grid2d(nRows);
  rec.dispatch({
    kernel: 'rms_norm',
    params: [n, nRows, f32(eps), gx, inOffset, inStride, outOffset, outStride],
    buffers: [x, w, out],
    groups: [gx, gy],
  });
}

/** In-place RoPE of x[xOffset …] = [nTokens × nHeads × headDim] with a [nTokens × nRot/2] (cos, sin) table. */
export function rope(
  rec: Recorder,
  x: GPUBuffer,
  xOffset: number,
  table: GPUBuffer,
  nTokens: number,
  nHeads: number,
  headDim: number,
  nRot: number,
  neox: boolean,
): void {
  const [gx, gy] = grid2d(Math.ceil((nTokens * nHeads * (nRot / 2)) / WG));
  rec.dispatch({
    kernel: 'rope',
    params: [nHeads, headDim, nRot, nTokens, neox ? 1 : 0, gx, xOffset],
    buffers: [x, table],
    groups: [gx, gy],
  });
}

export interface AttentionShape {
  nHead: number;
  nHeadKv: number;
  headDim: number;
}

/** The part of a KV cache split by heads that one attention dispatch reads (whole: h0 0, all heads). */
export interface KvSlice {
  /** first KV head the part holds */
  h0: number;
  heads: number;
}

/** Elements the split-K partial buffer needs for `nKv` cached positions. */
export function attentionPartialElements(s: AttentionShape, nKv: number): number {
  return s.nHead * Math.ceil(nKv / ATTENTION_CHUNK) * (s.headDim + 2);
}

/**
 * One query token (q[qOffset …] = [nHead × headDim]) over nKv cached positions → out[outOffset …]
 * [nHead × headDim]; only the last `window` positions in a sliding-window layer (0: all). Scores
 * are q·k × scale.
 */
export function attentionDecode(
  rec: Recorder,
  s: AttentionShape,
  q: GPUBuffer,
  qOffset: number,
  kCache: GPUBuffer,
  vCache: GPUBuffer,
  partial: GPUBuffer,
  out: GPUBuffer,
  nKv: number,
  kvType: KvType = 'f32',
  window = 0,
  scale = 1 / Math.sqrt(s.headDim),
  parts: readonly { k: GPUBuffer; v: GPUBuffer; slice: KvSlice }[] = [{ k: kCache, v: vCache, slice: { h0: 0, heads: s.nHeadKv } }],
  outOffset = 0,
): void {
  const nChunks = Math.ceil(nKv / ATTENTION_CHUNK);
  const group = s.nHead / s.nHeadKv;
  const params = [s.nHead, s.nHeadKv, s.headDim, nKv, nChunks, f32(scale), qOffset, window, 0, 0, s.nHeadKv, outOffset];
  // each part's query heads score its cached heads; the combine merges every head's chunks
  for (const part of parts) {
    const partParams = [...params.slice(0, 8), part.slice.h0 * group, part.slice.h0, part.slice.heads, outOffset];
    rec.dispatch({ kernel: 'attention_decode', quant: kvType, entry: 'split', params: partParams, buffers: [q, part.k, part.v, partial], groups: [nChunks, part.slice.heads * group] });
  }
  rec.dispatch({
    kernel: 'attention_decode',
    quant: kvType,
    entry: 'combine',
    params,
    buffers: [undefined, undefined, undefined, partial, out],
    groups: [s.nHead],
  });
}

/** Causal (sliding-window when window > 0) attention of nTokens queries at positions pos0… (q, out: [nTokens × nHead × headDim]). */
export function attentionPrefill(
  rec: Recorder,
  s: AttentionShape,
  q: GPUBuffer,
  kCache: GPUBuffer,
  vCache: GPUBuffer,
  out: GPUBuffer,
  nTokens: number,
  pos0: number,
  kvType: KvType = 'f32',
  window = 0,
  scale = 1 / Math.sqrt(s.headDim),
  slice: KvSlice = { h0: 0, heads: s.nHeadKv },
): void {
  const group = s.nHead / s.nHeadKv;
  rec.dispatch({
    kernel: 'attention_prefill',
    quant: kvType,
    params: [s.nHead, s.nHeadKv, s.headDim, nTokens, pos0, f32(scale), window, slice.h0 * group, slice.h0, slice.heads],
    buffers: [q, kCache, vCache, out],
    groups: [nTokens, slice.heads * group],
  });
}

/**
 * Writes a batch's keys or values (src: [nTokens × nHeadKv·headDim] f32 from row `srcRow`) into
 * one part of a cache split by heads (or a whole one: h0 0, all heads), at positions pos0…:
 * f32, or packed f16.
 */
export function kvStore(rec: Recorder, src: GPUBuffer, dst: GPUBuffer, slice: KvSlice, headDim: number, kvDim: number, nTokens: number, pos0: number, kvType: KvType, srcRow = 0): void {
  const width = slice.heads * headDim;
  const units = kvType === 'f16' ? (nTokens * width) / 2 : nTokens * width;
  const [gx, gy] = grid2d(Math.ceil(units / WG));
  rec.dispatch({
    kernel: 'kv_store',
    entry: kvType === 'f16' ? 'store_f16' : 'store_f32',
    params: [nTokens, width, kvDim, srcRow * kvDim + slice.h0 * headDim, pos0, gx],
    buffers: [src, dst],
    groups: [gx, gy],
  });
}

/** In-place softmax of each of nRows rows of n elements. */
export function softmax(rec: Recorder, x: GPUBuffer, n: number, nRows: number): void {
  const [gx, gy] = grid2d(nRows);
  rec.dispatch({ kernel: 'softmax', params: [n, nRows, gx], buffers: [x], groups: [gx, gy] });
}

/** g = silu(g) * u over n elements. */
export function swiglu(rec: Recorder, g: GPUBuffer, u: GPUBuffer, n: number): void {
  const [gx, gy] = grid2d(Math.ceil(n / WG));
  rec.dispatch({ kernel: 'swiglu', params: [n, gx], buffers: [g, u], groups: [gx, gy] });
}

/** g = gelu(g) * u over n elements, GELU from `table` (65536 f32 by f16 bit pattern, cpu/gelu.ts's). */
export function geglu(rec: Recorder, g: GPUBuffer, u: GPUBuffer, table: GPUBuffer, n: number): void {
  const [gx, gy] = grid2d(Math.ceil(n / WG));
  rec.dispatch({ kernel: 'geglu', params: [n, gx], buffers: [g, u, table], groups: [gx, gy] });
}

/** x[r·cols + j] *= sigmoid(g[gOffset + r·gStride + j]) for r < rows, j < cols (Qwen3.5's gated attention). */
export function sigmoidGate(rec: Recorder, x: GPUBuffer, g: GPUBuffer, rows: number, cols: number, gOffset: number, gStride: number): void {
  const [gx, gy] = grid2d(Math.ceil((rows * cols) / WG));
  rec.dispatch({ kernel: 'sigmoid_gate', params: [rows * cols, cols, gOffset, gStride, gx], buffers: [x, g], groups: [gx, gy] });
}

/** x[xOffset + i] *= c for i < n. */
export function scale(rec: Recorder, x: GPUBuffer, xOffset: number, n: number, c: number): void {
  const [gx, gy] = grid2d(Math.ceil(n / WG));
  rec.dispatch({ kernel: 'scale', params: [n, gx, xOffset, f32(c)], buffers: [x], groups: [gx, gy] });
}

/** a[aOffset + i] += b[i % nb] for i < n. */
export function add(rec: Recorder, a: GPUBuffer, aOffset: number, b: GPUBuffer, n: number, nb: number = n): void {
  const [gx, gy] = grid2d(Math.ceil(n / WG));
  rec.dispatch({ kernel: 'add', params: [n, nb, gx, aOffset], buffers: [a, b], groups: [gx, gy] });
}

/** n f32 (even n) from element xOffset → n/2 u32 each holding two f16, from element outOffset (both even). */
export function packF16(rec: Recorder, x: GPUBuffer, out: GPUBuffer, n: number, xOffset = 0, outOffset = 0): void {
  const [gx, gy] = grid2d(Math.ceil(n / 2 / WG));
  rec.dispatch({ kernel: 'pack_f16', params: [n / 2, gx, xOffset / 2, outOffset / 2], buffers: [x, out], groups: [gx, gy] });
}

/** n/2 u32 of f16 pairs → n f32. */
export function unpackF16(rec: Recorder, x: GPUBuffer, out: GPUBuffer, n: number): void {
  const [gx, gy] = grid2d(Math.ceil(n / 2 / WG));
  rec.dispatch({ kernel: 'unpack_f16', params: [n / 2, gx], buffers: [x, out], groups: [gx, gy] });
}

/** How ggml rounds activations before a matmul with a weight of some type (see act-round.ts). */
export type ActivationFormat = 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q8_K';

const ROUND_BLOCK: Record<Exclude<ActivationFormat, 'f32'>, number> = { f16: 1, bf16: 1, q8_0: 32, q8_K: 256 };

/** Whether `roundActivations` changes rows of `rowLength` elements in this format. */
export function roundsRows(format: ActivationFormat, rowLength: number): boolean {
  return format !== 'f32' && rowLength % ROUND_BLOCK[format] === 0;
}

/** out = x rounded as ggml rounds activations for `format` (nElements whole rows of rowLength). */
export function roundActivations(rec: Recorder, format: Exclude<ActivationFormat, 'f32'>, x: GPUBuffer, out: GPUBuffer, nElements: number): void {
  const units = nElements / ROUND_BLOCK[format];
  const [gx, gy] = grid2d(Math.ceil(units / WG));
  rec.dispatch({ kernel: 'round_activations', entry: format === 'q8_K' ? 'q8_k' : format, params: [units, gx], buffers: [x, out], groups: [gx, gy] });
}
