// What a CPU stage worker answers, in a page's module worker (workers/cpu-stage.worker.ts) and in
// a node's worker thread (workers/stage.node-worker.ts) alike: the stage worker API
// (../worker-api.ts) over a CPU engine, telling its threads and kernels after load. Only how
// the engine is made (its kernel threads) differs between the two.

import type { StageWorkerApi } from '../worker-api.ts';
import { stageWorkerApi } from '../worker-api.ts';
import type { CpuBackend } from './backend.ts';
import type { CpuWorkerInfo } from './in-worker.ts';
import { relaxedSimdAvailable } from './wasm-asm.ts';

/** What the CPU engine tells of itself after load. */
export function describeCpu(b: CpuBackend): CpuWorkerInfo {
  return { threads: b.threads, relaxedSimd: relaxedSimdAvailable() };
}

/** The worker's API over one engine made by `newBackend` when a shard is loaded. */
export function cpuWorkerApi(newBackend: () => CpuBackend): StageWorkerApi<CpuWorkerInfo> {
  return stageWorkerApi(newBackend, describeCpu, 'CPU_WORKER_FAILED');
}
