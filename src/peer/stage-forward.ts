// A stage's forwards through its compute queue: each frame (or chunk) of a session waits its
// turn, and a one-token step carries what the backend's forwardBatch takes, so when other
// sessions' decode steps wait beside it they run as one pass (./compute-queue.ts batching;
// backends/cpu/batch-forward.ts, backends/webgpu/rows-attention.ts). A backend without
// forwardBatch runs every step alone.

import { MeshError } from '../errors.ts';
import type { BatchStep, ForwardResult, HiddenRows, RowsForwardResult, StageBackend, StageInput } from '../backends/types.ts';
import type { Frame } from '../protocol/frame.ts';
import { ComputeQueue } from './compute-queue.ts';

/** most sessions' decode steps one batched pass takes */
export const BATCH_STEPS = 32;

export type StageQueue = ComputeQueue<BatchStep>;

/** The stage's queue, batching decode steps where the backend can. */
export function stageQueue(backend: StageBackend, maxBatch = BATCH_STEPS): StageQueue {
  const batch = backend.forwardBatch?.bind(backend);
  return new ComputeQueue<BatchStep>(batch ? { max: maxBatch, run: (steps) => batch(steps) } : null);
}

/** Frame `f`'s forward at its turn: rows straight through where the backend takes them, decoded f32 otherwise. */
export function stageForward(queue: StageQueue, backend: StageBackend, f: Frame, input: StageInput | HiddenRows, outDtype: 'f16' | 'f32'): Promise<{ value: ForwardResult | RowsForwardResult; waitedMs: number }> {
  const alone = (): Promise<ForwardResult | RowsForwardResult> => {
    if (backend.forwardRows) return backend.forwardRows(f.sessionId, input, f.position, outDtype);
    if (input.kind === 'rows') throw new MeshError('BAD_STAGE_INPUT', 'internal: encoded rows for a backend that takes f32');
    return backend.forward(f.sessionId, input, f.position);
  };
  if (f.nTokens !== 1) return queue.run(f.sessionId, 'prefill', alone);
  return queue.run(f.sessionId, 'decode', alone, { sessionId: f.sessionId, input, position: f.position, outDtype });
}
