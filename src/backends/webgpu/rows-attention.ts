// One block's attention over a batch of sessions' decode steps (ForwardPass.runBatch): row i of
// the scratch is one token of session i at that session's own position. The projections run
// over all rows at once (the caller's `mm`, every row summed as the decode kernel sums one
// alone); RoPE reads a table whose row i holds session i's angles; then row by row its key and
// value go into its own session's cache and its query attends that cache alone — the same
// dispatches, on the same values, as that session's own one-token forward.

import type { ModelConfig } from '../../model/config.ts';
import type { Recorder } from './kernels.ts';
import type { GpuMatrix } from './matrix.ts';
import * as op from './ops.ts';
import type { Scratch } from './forward-buffers.ts';
import type { KvPart } from './session-kv.ts';
import type { KvType } from './shader-library.ts';
import type { LayerWeights } from './shard-weights.ts';

/**
 * Whether a stage of this shard runs one-token steps of several sessions as one pass: every
 * layer attends (Gated DeltaNet layers carry per-session recurrent state through kernels that
 * take one session) and no layer routes to experts (the expert kernels group one session's
 * tokens). Other shards run their sessions' steps one by one.
 */
export function batchesShard(c: ModelConfig, shard: { start: number; end: number }): boolean {
  return !c.moe && !c.recurrentLayers.slice(shard.start, shard.end).some(Boolean);
}

/** One row's session in one layer: its cache parts and the position its token takes. */
export interface RowKv {
  keys: GPUBuffer[];
  values: GPUBuffer[];
  parts: readonly KvPart[];
  position: number;
}

/** out rows [B × …] = w · x rows, every row as the decode kernel computes it; memo: rounded copies of x */
export type RowsMatmul = (w: GpuMatrix, x: GPUBuffer, memo: Map<string, GPUBuffer>, out: GPUBuffer, outOffset: number, outStride: number) => void;

/** Records the attention of layer `w` for rows (session i at rows[i]); the output projection lands in sc.tmp, before the residual. */
export function recordRowsAttention(
  rec: Recorder,
  c: ModelConfig,
  kvType: KvType,
  w: LayerWeights,
  rows: readonly RowKv[],
  sc: Scratch,
  partial: GPUBuffer,
  ropeTab: GPUBuffer,
  window: number,
  mm: RowsMatmul,
): void {
  const B = rows.length;
  const { nEmbd, nHead, nHeadKv, headDim, rmsEps } = c;
  const qDim = nHead * headDim;
  const kvDim = nHeadKv * headDim;
  const neox = c.rope.mode === 'neox';

  op.rmsNorm(rec, sc.x, 0, nEmbd, w.attnNorm, sc.xb, 0, nEmbd, nEmbd, B, rmsEps);
  const normed = new Map<string, GPUBuffer>();
  const { qRaw, qStride } = recordQueries(rec, c, w, sc, B, ropeTab, normed, mm);

  // keys and values of every row in f32 scratch: each goes to its own session's cache below
  let kBuf = sc.kTmp!;
  mm(w.wk, sc.xb, normed, kBuf, 0, kvDim);
  if (w.bk) op.add(rec, kBuf, 0, w.bk, B * kvDim, kvDim);
  if (w.kNorm) {
    op.rmsNorm(rec, kBuf, 0, headDim, w.kNorm, sc.kTmp2!, 0, headDim, headDim, B * nHeadKv, rmsEps);
    kBuf = sc.kTmp2!;
  }
  op.rope(rec, kBuf, 0, ropeTab, B, nHeadKv, headDim, c.rope.nRot, neox);
  const vBuf = sc.vTmp!;
  mm(w.wv, sc.xb, normed, vBuf, 0, kvDim);
  if (w.bv) op.add(rec, vBuf, 0, w.bv, B * kvDim, kvDim);

  const shape = { nHead, nHeadKv, headDim };
  const scoreScale = c.queryScale !== null ? 1 : 1 / Math.sqrt(headDim);
  rows.forEach((r, i) => {
    const split = r.parts.length > 1;
    const slices = r.parts.map((part, p) => ({ k: r.keys[p]!, v: r.values[p]!, slice: split ? part : { h0: 0, heads: nHeadKv } }));
    for (const s of slices) {
      op.kvStore(rec, kBuf, s.k, s.slice, headDim, kvDim, 1, r.position, kvType, i);
      op.kvStore(rec, vBuf, s.v, s.slice, headDim, kvDim, 1, r.position, kvType, i);
    }
    op.attentionDecode(rec, shape, sc.q, i * qDim, r.keys[0]!, r.values[0]!, partial, sc.att, r.position + 1, kvType, window, scoreScale, slices, i * qDim);
  });
  if (w.outputGate) op.sigmoidGate(rec, sc.att, qRaw, B * nHead, headDim, headDim, qStride);
  mm(w.wo, sc.att, new Map(), sc.tmp, 0, nEmbd);
}

/**
 * The queries of n rows into sc.q, RoPE'd with `ropeTab` (and scaled where the model scales them):
 * the q projection (+ bias; Qwen3: per-head norm; Qwen3.5: per head the query, then its output
 * gate, in qRaw with stride qStride), for one session's tokens (forward-pass.ts) or a batch's.
 */
export function recordQueries(rec: Recorder, c: ModelConfig, w: LayerWeights, sc: Scratch, n: number, ropeTab: GPUBuffer, normed: Map<string, GPUBuffer>, mm: RowsMatmul): { qRaw: GPUBuffer; qStride: number } {
  const { nHead, headDim, rmsEps } = c;
  const qDim = nHead * headDim;
  const gated = w.outputGate === true;
  const qRaw = gated ? sc.qGate! : w.qNorm ? sc.att : sc.q;
  const qStride = gated ? 2 * headDim : headDim;
  mm(w.wq, sc.xb, normed, qRaw, 0, gated ? 2 * qDim : qDim);
  if (w.bq) op.add(rec, qRaw, 0, w.bq, n * qDim, qDim);
  if (w.qNorm) op.rmsNorm(rec, qRaw, 0, qStride, w.qNorm, sc.q, 0, headDim, headDim, n * nHead, rmsEps);
  op.rope(rec, sc.q, 0, ropeTab, n, nHead, headDim, c.rope.nRot, c.rope.mode === 'neox');
  // gemma3, phi3: queries scaled before attention, scores not scaled again
  if (c.queryScale !== null) op.scale(rec, sc.q, 0, n * qDim, c.queryScale);
  return { qRaw, qStride };
}
