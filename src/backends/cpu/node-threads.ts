// Worker threads for the CPU engine in Node (node:worker_threads), and the CPU backend that uses
// them: every core by default. Node-only; pages start their workers from Blob URLs instead.
//
// Node 20's V8 has relaxed SIMD (the kernels' fused multiply-add) behind a flag that browsers and
// Node 22 ship enabled; it is turned on here, before any kernel module is compiled.
//
// On Linux the engine's memory is advised to use transparent huge pages (madvise, through
// koffi): streaming the weights through 4 KiB pages costs a TLB walk and a cold prefetcher per
// page, and huge pages took a streaming read from 9.4 to 15 GB/s on one core here, as ggml
// asks for its own buffers.

import { availableParallelism } from 'node:os';
import { createRequire } from 'node:module';
import { setFlagsFromString } from 'node:v8';
import { Worker } from 'node:worker_threads';
import { CpuBackend } from './backend.ts';
import type { CpuBackendOptions } from './backend.ts';
import type { WorkerFactory } from './compute-pool.ts';
import type { MemoryAdvisor } from './wasm-arena.ts';

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

const MADV_HUGEPAGE = 14;
let madvise: ((addr: Uint8Array, len: number, advice: number) => number) | null | undefined;

/** madvise(MADV_HUGEPAGE) over the memory on Linux; nothing elsewhere or where it fails */
export const hugePages: MemoryAdvisor = (memory) => {
  if (madvise === undefined) {
    madvise = null;
    if (process.platform === 'linux') {
      try {
        const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
        madvise = koffi.load('libc.so.6').func('int madvise(void *addr, size_t len, int advice)') as unknown as typeof madvise;
      } catch {
        madvise = null;
      }
    }
  }
  madvise?.(new Uint8Array(memory), memory.byteLength, MADV_HUGEPAGE);
};

/** a CPU backend on `threads` threads (default: every core), its memory on huge pages */
export function createNodeCpuBackend(options: CpuBackendOptions = {}): CpuBackend {
  return new CpuBackend({ threads: availableParallelism(), adviseMemory: hugePages, ...options, workers: nodeWorkers });
}
