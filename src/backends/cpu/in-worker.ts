// The CPU engine behind a worker: a page's stage when the tab has no WebGPU (or is told to use
// the CPU), in a module worker (workers/cpu-stage.worker.ts), and a native node's CPU stage in a
// worker thread (workers/stage-thread.ts). The generic part is ../in-worker.ts; here is what the
// parent knows of the CPU engine, and the page's worker's failure events.

import { MeshError } from '../../errors.ts';
import { WorkerStageBackend } from '../in-worker.ts';
import type { WorkerEngineSpec } from '../in-worker.ts';
import type { BatchStep, ForwardResult } from '../types.ts';

export interface CpuWorkerInfo {
  /** threads the engine computes on (more than 1 only in a cross-origin-isolated page, or a node) */
  threads: number;
  /** whether the fused multiply-add kernels run (relaxed SIMD) */
  relaxedSimd: boolean;
}

/** The CPU engine as the parent sees it: forward on floats, and batched decode steps. */
export const CPU_ENGINE: WorkerEngineSpec = { kind: 'cpu', failCode: 'CPU_WORKER_FAILED', forwardRows: false, forwardBatch: true };

/** A CPU stage in a worker; its batches answer forward's results (the engine takes no rows). */
export type CpuWorkerBackend = Omit<WorkerStageBackend<CpuWorkerInfo>, 'forwardBatch'> & { forwardBatch(steps: readonly BatchStep[]): Promise<ForwardResult[]> };

/**
 * A backend computing in `worker`, a module worker started from workers/cpu-stage.worker.ts
 * (workers/cpu-stage.ts does both). If the worker dies, every call in flight and after fails
 * with CPU_WORKER_FAILED instead of hanging.
 */
export function cpuBackendInModuleWorker(worker: Worker): CpuWorkerBackend {
  const died = new Promise<never>((_, reject) => {
    const fail = (what: string) => reject(new MeshError('CPU_WORKER_FAILED', `the CPU stage worker failed: ${what}`));
    worker.addEventListener('error', (e) => {
      e.preventDefault();
      fail(e.message || 'it could not start or threw outside a call');
    });
    worker.addEventListener('messageerror', () => fail('a message could not be deserialised'));
  });
  return WorkerStageBackend.over<CpuWorkerInfo>(worker, died, () => worker.terminate(), CPU_ENGINE) as CpuWorkerBackend;
}
