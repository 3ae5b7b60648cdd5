// What a CPU stage worker answers, in a page's module worker (workers/cpu-stage.worker.ts) and in
// a node's worker thread (workers/cpu-stage.node-worker.ts) alike: the engine behind comlink,
// every method a WireResult so error codes survive the thread hop, outputs transferred back.
// Only how the engine is made (its kernel threads) differs between the two.

import * as Comlink from 'comlink';
import { MeshError } from '../../errors.ts';
import type { TensorInfo, TensorSource } from '../../gguf/types.ts';
import type { BatchStep, StageInput } from '../types.ts';
import { wireCall } from '../wire.ts';
import type { CpuBackend } from './backend.ts';
import type { CpuStageModel, CpuWorkerApi, CpuWorkerInfo } from './in-worker.ts';
import { relaxedSimdAvailable } from './wasm-asm.ts';

/** A TensorSource over tensors already in memory (the worker's side of CpuStageModel). */
function memorySource(model: CpuStageModel): TensorSource {
  const bytes = new Map(model.tensors.map((t) => [t.name, t.bytes]));
  return {
    header: model.header,
    location: model.location,
    async read(infos: readonly TensorInfo[]) {
      const out = new Map<string, Uint8Array>();
      for (const t of infos) {
        const b = bytes.get(t.name);
        if (!b) throw new MeshError('TENSOR_MISSING', `${model.location}: tensor ${t.name} was not handed to the CPU worker`);
        out.set(t.name, b);
      }
      return out;
    },
    close: async () => undefined,
  };
}

/** The worker's API over one engine made by `newBackend` when a shard is loaded. */
export function cpuWorkerApi(newBackend: () => CpuBackend): CpuWorkerApi {
  let backend: CpuBackend | null = null;
  const current = (): CpuBackend => {
    if (!backend) throw new MeshError('NOT_LOADED', 'the CPU worker holds no shard yet; call load() first');
    return backend;
  };
  return {
    load: (model: CpuStageModel) =>
      wireCall(async (): Promise<CpuWorkerInfo> => {
        if (backend) throw new MeshError('ALREADY_LOADED', 'this CPU worker already holds a shard');
        const b = newBackend();
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
}
