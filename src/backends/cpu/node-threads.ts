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

// Pinning (`pinThreads`, Linux): the thread that starts the pool (the one that then runs every
// job with it) and each worker get one CPU of their own, in the order the process may use them.
// On a VM, after the engine's threads all slept — every stage of a route between its steps —
// Linux often wakes a worker on its waker's CPU, and the pass then runs on one core with both
// threads spinning at each other: a 2-layer 6×512 step took 2.0–2.8 ms after a 5 ms sleep
// against 0.85 ms back to back; with the threads pinned apart, 1.03–1.08. Opt-in: a pinned
// thread cannot leave a CPU that other work has taken.

/** the sched_setaffinity/sched_getaffinity mask bytes (1024 CPUs) */
const MASK_BYTES = 128;
const AFFINITY_SIGNATURES = ['int sched_setaffinity(int pid, size_t len, uint8_t *mask)', 'int sched_getaffinity(int pid, size_t len, _Out_ uint8_t *mask)'] as const;
const MADVISE_SIGNATURE = 'int madvise(void *addr, size_t len, int advice)';

/** koffi's path, for a worker's own require (an eval'd worker resolves no package from here) */
function koffiPath(): string {
  return createRequire(import.meta.url).resolve('koffi');
}

type LibcCall = (...args: unknown[]) => number;
let libcCalls: Map<string, LibcCall> | null | undefined;

/** libc's function of `signature` through koffi (loaded once), or null off Linux or where koffi does not load */
function libcCall(signature: string): LibcCall | null {
  if (libcCalls === undefined) {
    libcCalls = null;
    if (process.platform === 'linux') {
      try {
        const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
        const libc = koffi.load('libc.so.6');
        libcCalls = new Map(
          [...AFFINITY_SIGNATURES, MADVISE_SIGNATURE].map((sig) => [sig, libc.func(sig) as unknown as LibcCall]),
        );
      } catch {
        libcCalls = null;
      }
    }
  }
  return libcCalls?.get(signature) ?? null;
}

/** sched_*affinity of the calling thread (pid 0), or null off Linux or where koffi does not load */
function affinityCalls(): { set: (pid: number, len: number, mask: Uint8Array) => number; get: (pid: number, len: number, mask: Uint8Array) => number } | null {
  const [set, get] = AFFINITY_SIGNATURES.map(libcCall);
  return set && get ? { set, get } : null;
}

/**
 * The CPUs the calling thread may run on, in order; null where that cannot be read. Note that a
 * thread (or process) started by a pinned thread inherits its one CPU: start engines that pin
 * from a thread that spawns nothing else (a node's engine thread), or read this first.
 */
export function allowedCpus(): number[] | null {
  const calls = affinityCalls();
  const mask = new Uint8Array(MASK_BYTES);
  if (!calls || calls.get(0, MASK_BYTES, mask) !== 0) return null;
  const cpus: number[] = [];
  for (let c = 0; c < MASK_BYTES * 8; c++) if (mask[c >> 3]! & (1 << (c & 7))) cpus.push(c);
  return cpus;
}

function maskOf(cpu: number): Uint8Array {
  const mask = new Uint8Array(MASK_BYTES);
  mask[cpu >> 3] = 1 << (cpu & 7);
  return mask;
}

/** the code a worker runs first to pin itself to `cpu` (before the pool's own source) */
function pinPrelude(cpu: number): string {
  const bytes = JSON.stringify([...maskOf(cpu)]);
  return `{ const k = require(${JSON.stringify(koffiPath())}); k.load('libc.so.6').func(${JSON.stringify(AFFINITY_SIGNATURES[0])})(0, ${MASK_BYTES}, Uint8Array.from(${bytes})); }\n`;
}

/**
 * Worker threads pinned one CPU each: the thread creating the pool (its caller) to the first
 * CPU this thread may use, worker i to the (i + 1)-th, wrapping around when there are more
 * threads than CPUs. Where affinity cannot be set (not Linux, koffi missing, a single CPU), the
 * plain workers.
 */
export function pinnedNodeWorkers(): WorkerFactory {
  let cpus: number[] | null | undefined;
  let next = 0;
  return (source) => {
    if (cpus === undefined) {
      // the CPUs this thread had before any engine here pinned it: every pool it starts agrees
      cpus = (threadCpus ??= allowedCpus() ?? []).length > 1 ? threadCpus : null;
      if (cpus && affinityCalls()!.set(0, MASK_BYTES, maskOf(cpus[0]!)) === 0) next = 1;
      else cpus = null;
    }
    if (!cpus) return nodeWorkers(source);
    return nodeWorkers(pinPrelude(cpus[next++ % cpus.length]!) + source);
  };
}

/** this thread's CPUs as the first pinned pool found them (module state: one per thread) */
let threadCpus: number[] | undefined;

const MADV_HUGEPAGE = 14;

/** madvise(MADV_HUGEPAGE) over the memory on Linux; nothing elsewhere or where it fails */
export const hugePages: MemoryAdvisor = (memory) => {
  libcCall(MADVISE_SIGNATURE)?.(new Uint8Array(memory), memory.byteLength, MADV_HUGEPAGE);
};

export interface NodeCpuBackendOptions extends CpuBackendOptions {
  /** each of the engine's threads on a CPU of its own (Linux; see pinnedNodeWorkers) */
  pinThreads?: boolean;
}

/** a CPU backend on `threads` threads (default: every core), its memory on huge pages */
export function createNodeCpuBackend(options: NodeCpuBackendOptions = {}): CpuBackend {
  const { pinThreads, ...rest } = options;
  return new CpuBackend({ threads: availableParallelism(), adviseMemory: hugePages, ...rest, workers: pinThreads ? pinnedNodeWorkers() : nodeWorkers });
}
