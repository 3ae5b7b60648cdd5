// Starts the CPU engine in its own dedicated module worker, for a tab without WebGPU. The
// `new Worker(new URL(…))` form lives here, beside the worker's entry, so bundlers emit it.

import { cpuBackendInModuleWorker } from '../src/backends/cpu/in-worker.ts';
import type { CpuWorkerBackend } from '../src/backends/cpu/in-worker.ts';

export function startCpuStageWorker(): Worker {
  return new Worker(new URL('./cpu-stage.worker.ts', import.meta.url), { type: 'module', name: 'gguf-mesh cpu stage' });
}

/** A CPU StageBackend computing in a new worker (see cpuBackendInModuleWorker). */
export function cpuBackendInWorker(): CpuWorkerBackend {
  return cpuBackendInModuleWorker(startCpuStageWorker());
}
