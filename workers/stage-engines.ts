// The engines a native node runs in a worker thread (workers/stage-thread.ts starts one,
// workers/stage.node-worker.ts runs it): what the parent knows of each before it loads, what
// it is made with, and what it tells of itself after load. Each engine's modules are imported
// only in the thread that runs it, so a CPU node never loads libllama.

import type { NodeCpuBackendOptions } from '../src/backends/cpu/node-threads.ts';
import { CPU_ENGINE } from '../src/backends/cpu/in-worker.ts';
import type { CpuWorkerInfo } from '../src/backends/cpu/in-worker.ts';
import type { WorkerEngineSpec } from '../src/backends/in-worker.ts';
import type { LlamaCppRangeOptions } from '../src/backends/llamacpp/range-stage.ts';
import type { LlamaCppStageOptions } from '../src/backends/llamacpp/stage.ts';
import type { StageWorkerApi } from '../src/backends/worker-api.ts';
import { stageWorkerApi } from '../src/backends/worker-api.ts';

export interface ThreadEngines {
  /** the CPU engine, its kernels on this thread and threads − 1 more (node-threads.ts) */
  cpu: { options: Pick<NodeCpuBackendOptions, 'threads' | 'weightStorage' | 'pinThreads'>; info: CpuWorkerInfo };
  /** llama.cpp over a layer range, from a shard GGUF written from the shard's tensors */
  'llamacpp-range': { options: LlamaCppRangeOptions; info: { weightBytes: number; weightBuffers: Record<string, number>; threads: number } };
  /** llama.cpp over the whole model, from the artifact's own local file (source.location) */
  llamacpp: { options: LlamaCppStageOptions; info: { threads: number } };
}
export type ThreadEngine = keyof ThreadEngines;

const LLAMACPP = { kind: 'llamacpp', failCode: 'LLAMACPP_THREAD_FAILED' } as const;

export const THREAD_ENGINES: { [E in ThreadEngine]: WorkerEngineSpec } = {
  cpu: CPU_ENGINE,
  // frames' rows go to llama.cpp's batch as they are (forwardRows); concurrent sessions' steps
  // as one llama_decode (forwardBatch, range-pool.ts)
  'llamacpp-range': { ...LLAMACPP, forwardRows: true, forwardBatch: true },
  llamacpp: { ...LLAMACPP, forwardRows: false, forwardBatch: false },
};

/** The API a thread running `engine` answers (in that thread). */
export async function threadEngineApi<E extends ThreadEngine>(engine: E, options: ThreadEngines[E]['options']): Promise<StageWorkerApi<ThreadEngines[E]['info']>> {
  const fail = THREAD_ENGINES[engine].failCode;
  const apis: { [K in ThreadEngine]: (o: ThreadEngines[K]['options']) => Promise<StageWorkerApi<ThreadEngines[K]['info']>> } = {
    cpu: async (o) => {
      const { createNodeCpuBackend } = await import('../src/backends/cpu/node-threads.ts');
      const { cpuWorkerApi } = await import('../src/backends/cpu/worker-api.ts');
      return cpuWorkerApi(() => createNodeCpuBackend(o));
    },
    'llamacpp-range': async (o) => {
      const { LlamaCppRangeStage } = await import('../src/backends/llamacpp/range-stage.ts');
      return stageWorkerApi(() => new LlamaCppRangeStage(o), (b) => ({ weightBytes: b.weightBytes, weightBuffers: b.weightBuffers, threads: b.threads }), fail);
    },
    llamacpp: async (o) => {
      const { LlamaCppStage } = await import('../src/backends/llamacpp/stage.ts');
      return stageWorkerApi(() => new LlamaCppStage(o), (b) => ({ threads: b.threads }), fail);
    },
  };
  return (apis[engine] as (o: ThreadEngines[E]['options']) => Promise<StageWorkerApi<ThreadEngines[E]['info']>>)(options);
}
