// Dispatches of the mixture-of-experts kernels: routing (moe_route), grouping slots by expert
// (moe_group), the expert matmuls — gather-by-expert mat-vec for decode (mul_mat_vec_id), the
// grouped matmul for batches (mul_mat_id) — and the weighted combine (moe_combine). A "slot"
// is one (token, chosen expert) pair, t·k + j. Offsets and strides are in elements.

import { grid2d } from './kernels.ts';
import type { Recorder } from './kernels.ts';
import type { GpuExperts } from './experts.ts';

const WG = 64;

/** Experts per token and weights from router logits [nTokens × nExpert] → ids, weights [nTokens × k]. */
export function moeRoute(rec: Recorder, logits: GPUBuffer, ids: GPUBuffer, weights: GPUBuffer, nTokens: number, nExpert: number, k: number, norm: boolean): void {
  const [gx, gy] = grid2d(Math.ceil(nTokens / WG));
  rec.dispatch({ kernel: 'moe_route', params: [nTokens, nExpert, k, norm ? 1 : 0, gx], buffers: [logits, ids, weights], groups: [gx, gy] });
}

/** Slots sorted by expert: offsets [nExpert + 1] and slots [nSlots], from ids [nSlots]. */
export function moeGroup(rec: Recorder, ids: GPUBuffer, offsets: GPUBuffer, slots: GPUBuffer, nSlots: number, nExpert: number): void {
  rec.dispatch({ kernel: 'moe_group', params: [nSlots, nExpert], buffers: [ids, offsets, slots], groups: [1] });
}

/** Where an expert matmul reads x and writes out: x row of slot s = s / xDiv. */
export interface SlotIo {
  x: GPUBuffer;
  /** elements between x rows (multiple of 4) */
  xStride: number;
  /** k (x holds token rows) or 1 (x holds one row per slot) */
  xDiv: number;
  out: GPUBuffer;
  /** elements between out rows */
  outStride: number;
}

/** Decode: out[slot, :] = W_{ids[slot]} · x[slot / xDiv] for nSlots slots, one workgroup per (row, slot). */
export function matVecId(rec: Recorder, w: GpuExperts, io: SlotIo, ids: GPUBuffer, nSlots: number): void {
  const [gx, gy] = grid2d(w.expertRows);
  const expertBytes = w.expertRows * w.rowBytes;
  w.chunks.forEach((c, i) => {
    rec.dispatch({
      kernel: 'mul_mat_vec_id',
      quant: w.quant,
      params: [w.k, w.expertRows, w.rowBytes, io.xStride, io.xDiv, io.outStride, c.e0, c.experts, gx],
      buffers: [c.buffer, io.x, io.out, ids],
      groups: [gx, gy, nSlots],
      // the slots' experts, wherever they live (a token's top-k are distinct), counted once
      reads: i === 0 ? Math.min(nSlots, w.nExpert) * expertBytes : 0,
    });
  });
}

/** Any batch: the grouped matmul over moe_group's slots and offsets; experts with no slots do nothing. */
export function matMulId(rec: Recorder, w: GpuExperts, io: SlotIo, slots: GPUBuffer, offsets: GPUBuffer, nSlots: number): void {
  const expertBytes = w.expertRows * w.rowBytes;
  w.chunks.forEach((c, i) => {
    rec.dispatch({
      kernel: 'mul_mat_id',
      quant: w.quant,
      params: [w.k, w.expertRows, w.rowBytes, io.xStride, io.xDiv, io.outStride, c.e0],
      buffers: [c.buffer, io.x, io.out, slots, offsets],
      groups: [Math.ceil(w.expertRows / WG), c.experts],
      // experts with no slots exit at once: at most one expert per slot is read
      reads: i === 0 ? Math.min(nSlots, w.nExpert) * expertBytes : 0,
    });
  });
}

/** out [nTokens × nEmbd] = Σ_j weights[t, j] · y[t·k + j]; plus shared · gate(shGate) when given. */
export function moeCombine(
  rec: Recorder,
  y: GPUBuffer,
  weights: GPUBuffer,
  out: GPUBuffer,
  nTokens: number,
  nEmbd: number,
  k: number,
  shared?: { out: GPUBuffer; gate: GPUBuffer; sigmoid?: boolean },
): void {
  const [gx, gy] = grid2d(Math.ceil((nTokens * nEmbd) / WG));
  rec.dispatch({
    kernel: 'moe_combine',
    entry: shared ? (shared.sigmoid ? 'with_sigmoid_shared' : 'with_shared') : 'main',
    params: [nTokens, nEmbd, k, gx],
    buffers: shared ? [y, weights, out, shared.out, shared.gate] : [y, weights, out],
    groups: [gx, gy],
  });
}
