// Decode steps of several sessions as one forward pass: B rows, each one token of its own
// session at its own position. The projections and the feed-forward multiply all B rows at
// once (the weights stream through once instead of B times); rotary embedding, the KV write
// and attention go row by row against each row's own session's cache, exactly as that
// session's own one-token forward does them.
//
// Why the result is the same bit for bit as each session decoded alone: every kernel a row
// goes through computes each output row on its own, in an order that does not depend on how
// many rows came with it (the matmul tiles, ./wasm-f32.ts and ./wasm-q8.ts; activation
// rounding and Q8_0 quantisation are per 32-block; RMSNorm, biases and residuals per row;
// the mixture of experts routes and sums per token; SwiGLU runs row by row where a row is not
// a multiple of the kernel's four), and attention is called once per row with that row's
// single-token plan. test/cpu-batch.test.ts checks it against one-by-one decoding.

import type { ModelConfig } from '../../model/config.ts';
import { ropeFor } from '../../model/config.ts';
import { attendCached, attentionScratchBytes } from './attention.ts';
import { forwardLayer, forwardLayers, scratchFor } from './forward.ts';
import type { RowPlacement } from './forward.ts';
import type { KvCache } from './kv-cache.ts';
import { rope, scaleInPlace } from './ops.ts';
import type { ShardWeights } from './weights.ts';

/** one row each of these sessions, row i at kvs[i].length (as it was when the pass began: `pos`) */
function batchRows(kvs: readonly KvCache[], pos: readonly number[]): RowPlacement {
  return {
    attend(cfg, l, il, s) {
      const { nHead, nHeadKv, headDim } = cfg;
      const qDim = nHead * headDim;
      const kvDim = nHeadKv * headDim;
      const window = cfg.swaLayers[il] ? cfg.slidingWindow : 0;
      kvs.forEach((kv, i) => {
        const q = s.q.subarray(i * qDim, (i + 1) * qDim);
        const k = s.k.subarray(i * kvDim, (i + 1) * kvDim);
        const ropeCfg = ropeFor(cfg, il, kv.contextLength);
        rope(q, 1, nHead, headDim, pos[i]!, ropeCfg, s.ropeCache);
        rope(k, 1, nHeadKv, headDim, pos[i]!, ropeCfg, s.ropeCache);
        if (cfg.queryScale !== null) scaleInPlace(q, cfg.queryScale);
        kv.write(l, pos[i]!, k, s.v.subarray(i * kvDim, (i + 1) * kvDim), 1);
        attendCached(kv, l, cfg, q.byteOffset, s.att.byteOffset + i * qDim * 4, 1, pos[i]!, s.scores, cfg.queryScale === null ? undefined : 1, window);
      });
    },
  };
}

/**
 * Runs every layer of the shard over x (in place), row i being the next token of the session
 * whose cache is kvs[i], and advances each cache by one. x: [B × nEmbd]; kvs: distinct sessions.
 * Shards with recurrent (Gated DeltaNet) layers take their rows one at a time: same results,
 * no batching. On failure the caches may be part-way: the caller rewinds them.
 */
export function forwardSessions(cfg: ModelConfig, weights: ShardWeights, kvs: readonly KvCache[], x: Float32Array): void {
  const B = kvs.length;
  const pos = kvs.map((kv) => kv.length);
  if (weights.layers.some((w) => 'mixer' in w)) {
    kvs.forEach((kv, i) => forwardLayers(cfg, weights, kv, x.subarray(i * cfg.nEmbd, (i + 1) * cfg.nEmbd), 1));
    return;
  }
  // every cache grows first: growing may move the memory the scratch views look at
  for (const kv of kvs) kv.reserve(1);
  const arena = weights.arena;
  const s = scratchFor(cfg, weights, arena, B, Math.max(...pos.map((p) => attentionScratchBytes(cfg, 1, p))));
  const rows = batchRows(kvs, pos);
  try {
    for (let l = 0; l < weights.layers.length; l++) {
      const w = weights.layers[l]!;
      if ('mixer' in w) continue; // excluded above; narrows the type
      forwardLayer(cfg, w, rows, arena, l, weights.layerStart + l, x, B, s);
      for (const kv of kvs) kv.processedTokens[l]! += 1;
    }
  } finally {
    arena.free(s.region);
  }
  kvs.forEach((kv, i) => (kv.length = pos[i]! + 1));
}
