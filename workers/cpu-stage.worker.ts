// The dedicated module worker that runs the CPU engine for a page (a tab without WebGPU). The
// page talks to it through comlink (src/backends/in-worker.ts; the API is
// src/backends/cpu/worker-api.ts). Where the page is cross-origin isolated, the engine's
// kernels also run on worker threads of their own (Blob URL workers over a shared memory);
// otherwise on this one.

import * as Comlink from 'comlink';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import type { WorkerFactory } from '../src/backends/cpu/compute-pool.ts';
import { sharedMemoryAvailable } from '../src/backends/cpu/wasm-arena.ts';
import { cpuWorkerApi } from '../src/backends/cpu/worker-api.ts';

/** kernel threads from Blob URLs (classic workers; the pool's worker script is self-contained) */
const blobWorkers: WorkerFactory = (source) => {
  const url = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
  const w = new Worker(url, { name: 'gguf-mesh cpu kernels' });
  URL.revokeObjectURL(url);
  return {
    postMessage: (m) => w.postMessage(m),
    terminate: () => w.terminate(),
    onError: (handler) => w.addEventListener('error', (e) => handler(e.message || 'a kernel worker failed')),
  };
};

Comlink.expose(
  cpuWorkerApi(() => {
    const threads = sharedMemoryAvailable() ? Math.max(1, self.navigator.hardwareConcurrency || 1) : 1;
    return new CpuBackend(threads > 1 ? { threads, workers: blobWorkers } : {});
  }),
);
