// Worker threads for the CPU engine in Node (node:worker_threads), and the CPU backend that uses
// them: every core by default. Node-only; pages start their workers from Blob URLs instead.
//
// Node 20's V8 has relaxed SIMD (the kernels' fused multiply-add) behind a flag that browsers and
// Node 22 ship enabled; it is turned on here, before any kernel module is compiled.

import { availableParallelism } from 'node:os';
import { setFlagsFromString } from 'node:v8';
import { Worker } from 'node:worker_threads';
import { CpuBackend } from './backend.ts';
import type { CpuBackendOptions } from './backend.ts';
import type { WorkerFactory } from './compute-pool.ts';

setFlagsFromString('--experimental-wasm-relaxed-simd');

/** starts an eval'd worker thread that does not keep the process alive */
export const nodeWorkers: WorkerFactory = (source) => {
  const w = new Worker(source, { eval: true });
  w.unref();
  return {
    postMessage: (m) => w.postMessage(m),
    terminate: () => w.terminate(),
    onError: (handler) => w.on('error', (e) => handler(e.message)),
  };
};

/** a CPU backend on `threads` threads (default: every core) */
export function createNodeCpuBackend(options: CpuBackendOptions = {}): CpuBackend {
  return new CpuBackend({ threads: availableParallelism(), ...options, workers: nodeWorkers });
}
