// The dedicated module worker that runs the CPU engine for a page (a tab without WebGPU). The
// page talks to it through comlink (src/backends/cpu/in-worker.ts). Every method answers a
// WireResult, so errors keep their MeshError code across the thread boundary; outputs are
// transferred. Where the page is cross-origin isolated, the engine's kernels also run on
// worker threads of their own (Blob URL workers over a shared memory); otherwise on this one.

import * as Comlink from 'comlink';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import type { WorkerFactory } from '../src/backends/cpu/compute-pool.ts';
import { memorySource } from '../src/backends/cpu/in-worker.ts';
import type { CpuStageModel, CpuWorkerApi, CpuWorkerInfo } from '../src/backends/cpu/in-worker.ts';
import { sharedMemoryAvailable } from '../src/backends/cpu/wasm-arena.ts';
import { relaxedSimdAvailable } from '../src/backends/cpu/wasm-asm.ts';
import { wireCall } from '../src/backends/wire.ts';
import type { BatchStep, StageInput } from '../src/backends/types.ts';
import { MeshError } from '../src/errors.ts';

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

let backend: CpuBackend | null = null;

function current(): CpuBackend {
  if (!backend) throw new MeshError('NOT_LOADED', 'the CPU worker holds no shard yet; call load() first');
  return backend;
}

const api: CpuWorkerApi = {
  load: (model: CpuStageModel) =>
    wireCall(async (): Promise<CpuWorkerInfo> => {
      if (backend) throw new MeshError('ALREADY_LOADED', 'this CPU worker already holds a shard');
      const threads = sharedMemoryAvailable() ? Math.max(1, self.navigator.hardwareConcurrency || 1) : 1;
      const b = new CpuBackend(threads > 1 ? { threads, workers: blobWorkers } : {});
      await b.load(memorySource(model), model.shard);
      backend = b;
      return { threads: b.threads, relaxedSimd: relaxedSimdAvailable() };
    }, 'CPU_WORKER_FAILED'),
  openSession: (sessionId: string, contextLength: number) =>
    wireCall(async () => {
      await current().openSession(sessionId, { contextLength });
      return current().sessionStats(sessionId);
    }, 'CPU_WORKER_FAILED'),
  releaseSession: (sessionId: string) => wireCall(() => current().releaseSession(sessionId), 'CPU_WORKER_FAILED'),
  truncateSession: (sessionId: string, position: number) =>
    wireCall(async () => {
      await current().truncateSession(sessionId, position);
      return current().sessionStats(sessionId);
    }, 'CPU_WORKER_FAILED'),
  forward: async (sessionId: string, input: StageInput, position: number) => {
    const r = await wireCall(async () => {
      const result = await current().forward(sessionId, input, position);
      return { result, stats: current().sessionStats(sessionId) };
    }, 'CPU_WORKER_FAILED');
    if (!r.ok) return r;
    const out = r.value.result.output;
    return Comlink.transfer(r, [(out.kind === 'logits' ? out.logits : out.hidden).buffer as ArrayBuffer]);
  },
  forwardBatch: async (steps: BatchStep[]) => {
    const r = await wireCall(async () => {
      const results = await current().forwardBatch(steps);
      return { results, stats: steps.map((s) => current().sessionStats(s.sessionId)) };
    }, 'CPU_WORKER_FAILED');
    if (!r.ok) return r;
    const buffers = r.value.results.map(({ output: out }) => (out.kind === 'logits' ? out.logits : out.hidden).buffer as ArrayBuffer);
    return Comlink.transfer(r, [...new Set(buffers)]);
  },
  dispose: () =>
    wireCall(async () => {
      const b = backend;
      backend = null;
      await b?.dispose();
    }, 'CPU_WORKER_FAILED'),
};

Comlink.expose(api);
