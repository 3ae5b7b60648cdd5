// What a stage worker answers, whatever engine it runs: a page's module worker (the CPU engine,
// workers/cpu-stage.worker.ts) and a node's worker thread (the CPU engine or llama.cpp,
// workers/stage.node-worker.ts) alike. The engine is a StageBackend made in the worker when a
// shard is loaded; every call answers a WireResult, so error codes survive the thread hop, and
// outputs are transferred back with the session stats the parent keeps (./in-worker.ts).

import * as Comlink from 'comlink';
import type { ErrorCode } from '../error-codes.ts';
import { MeshError } from '../errors.ts';
import type { GgufHeader, TensorInfo, TensorSource } from '../gguf/types.ts';
import type { BatchStep, ForwardResult, HiddenRows, RowsForwardResult, SessionStats, ShardRange, StageBackend, StageInput } from './types.ts';
import { fromWire, wireCall } from './wire.ts';
import type { WireResult } from './wire.ts';

/** The parent's TensorSource, reached from the worker: reads answer with their buffers transferred, failures with their codes. */
export interface TensorReader {
  read(tensors: TensorInfo[]): Promise<WireResult<Map<string, Uint8Array>>>;
}

/** what the worker loads: the parent's source (its header and location; its reads come as their own argument, a comlink proxy) and the shard */
export interface StageWorkerModel {
  header: GgufHeader;
  location: string;
  shard: ShardRange;
}

type Output = ForwardResult | RowsForwardResult;

/** What a stage worker answers over comlink; `I` is what the engine tells of itself after load. */
export interface StageWorkerApi<I> {
  load(model: StageWorkerModel, reader: TensorReader): Promise<WireResult<I>>;
  openSession(sessionId: string, contextLength: number): Promise<WireResult<SessionStats>>;
  releaseSession(sessionId: string): Promise<WireResult<void>>;
  truncateSession(sessionId: string, position: number): Promise<WireResult<SessionStats>>;
  forward(sessionId: string, input: StageInput, position: number): Promise<WireResult<{ result: ForwardResult; stats: SessionStats }>>;
  forwardRows(sessionId: string, input: StageInput | HiddenRows, position: number, outDtype: 'f16' | 'f32'): Promise<WireResult<{ result: RowsForwardResult; stats: SessionStats }>>;
  forwardBatch(steps: BatchStep[]): Promise<WireResult<{ results: Output[]; stats: SessionStats[] }>>;
  dispose(): Promise<WireResult<void>>;
}

/** The buffer an output's values live in, to transfer it rather than copy. */
function outputBuffer({ output }: Output): ArrayBuffer {
  const view = output.kind === 'logits' ? output.logits : output.kind === 'hidden' ? output.hidden : output.bytes;
  return view.buffer as ArrayBuffer;
}

/** The parent's source as the worker's engine reads it (closing it is the parent's business). */
function remoteSource(model: StageWorkerModel, reader: TensorReader): TensorSource {
  return { header: model.header, location: model.location, read: async (infos) => fromWire(await reader.read([...infos])), close: async () => undefined };
}

/**
 * The worker's API over one engine, made by `newBackend` when a shard is loaded; `describe`
 * tells of it after load; `fallback` is the code of any error that is not a MeshError.
 */
export function stageWorkerApi<B extends StageBackend, I>(newBackend: () => B | Promise<B>, describe: (b: B) => I, fallback: ErrorCode): StageWorkerApi<I> {
  let backend: B | null = null;
  const current = (): B => {
    if (!backend) throw new MeshError('NOT_LOADED', 'the stage worker holds no shard yet; call load() first');
    return backend;
  };
  const call = <T>(fn: () => Promise<T> | T) => wireCall(fn, fallback);
  /** a result with its outputs' buffers handed over */
  const transferred = <T>(r: WireResult<T>, outputs: (v: T) => Output[]): WireResult<T> =>
    r.ok ? Comlink.transfer(r, [...new Set(outputs(r.value).map(outputBuffer))]) : r;
  const rowsOf = (b: B) => {
    if (!b.forwardRows) throw new MeshError('BAD_STAGE_INPUT', `the ${b.kind} engine takes no encoded rows`);
    return b.forwardRows.bind(b);
  };
  return {
    load: (model, reader) =>
      call(async () => {
        if (backend) throw new MeshError('ALREADY_LOADED', 'this stage worker already holds a shard');
        const b = await newBackend();
        try {
          await b.load(remoteSource(model, reader), model.shard);
        } catch (e) {
          await b.dispose().catch(() => undefined);
          throw e;
        } finally {
          (reader as Comlink.Remote<TensorReader>)[Comlink.releaseProxy]?.();
        }
        backend = b;
        return describe(b);
      }),
    openSession: (sessionId, contextLength) =>
      call(async () => {
        await current().openSession(sessionId, { contextLength });
        return current().sessionStats(sessionId);
      }),
    releaseSession: (sessionId) => call(() => current().releaseSession(sessionId)),
    truncateSession: (sessionId, position) =>
      call(async () => {
        await current().truncateSession(sessionId, position);
        return current().sessionStats(sessionId);
      }),
    forward: async (sessionId, input, position) =>
      transferred(
        await call(async () => {
          const result = await current().forward(sessionId, input, position);
          return { result, stats: current().sessionStats(sessionId) };
        }),
        (v) => [v.result],
      ),
    forwardRows: async (sessionId, input, position, outDtype) =>
      transferred(
        await call(async () => {
          const result = await rowsOf(current())(sessionId, input, position, outDtype);
          return { result, stats: current().sessionStats(sessionId) };
        }),
        (v) => [v.result],
      ),
    forwardBatch: async (steps) =>
      transferred(
        await call(async () => {
          const b = current();
          if (!b.forwardBatch) throw new MeshError('BAD_STAGE_INPUT', `the ${b.kind} engine runs no batches`);
          const results = await b.forwardBatch(steps);
          return { results, stats: steps.map((s) => b.sessionStats(s.sessionId)) };
        }),
        (v) => v.results,
      ),
    dispose: () =>
      call(async () => {
        const b = backend;
        backend = null;
        await b?.dispose();
      }),
  };
}
