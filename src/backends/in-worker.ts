// A StageBackend whose engine computes behind a worker (./worker-api.ts answers there): a page's
// CPU stage in a module worker, a native node's CPU or llama.cpp stage in a worker thread, so
// the calling thread stays free while a shard loads or a long prefill computes. The engine reads
// the shard's tensors from the source here through a callback (their buffers transferred, so
// they are detached here afterwards); llama.cpp's whole model reads its own file by location.
// Session stats come back with each call, so sessionStats stays synchronous as StageBackend
// wants, and a worker that dies fails every call in flight and after with the engine's code.

import * as Comlink from 'comlink';
import type { ErrorCode } from '../error-codes.ts';
import { MeshError } from '../errors.ts';
import type { TensorInfo, TensorSource } from '../gguf/types.ts';
import type { BatchStep, ForwardResult, HiddenRows, RowsForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from './types.ts';
import { fromWire, wireCall } from './wire.ts';
import type { WireResult } from './wire.ts';
import type { StageWorkerApi, TensorReader } from './worker-api.ts';

/** What the parent knows of the engine in the worker before it loads. */
export interface WorkerEngineSpec {
  kind: StageBackend['kind'];
  /** the code of a dead worker's failures (and of the worker's non-MeshErrors) */
  failCode: ErrorCode;
  /** whether the engine takes and gives encoded rows (StageBackend.forwardRows) */
  forwardRows: boolean;
  /** whether the engine runs one-token steps of many sessions as one pass (StageBackend.forwardBatch) */
  forwardBatch: boolean;
}

/** `source`'s reads for the worker, each answer's buffers transferred (a failure keeps its code: TENSOR_HASH_MISMATCH, …). */
function readerOver(source: TensorSource, failCode: ErrorCode): TensorReader {
  return Comlink.proxy({
    async read(infos: TensorInfo[]) {
      const r = await wireCall(() => source.read(infos), failCode);
      return r.ok ? Comlink.transfer(r, [...new Set([...r.value.values()].map((b) => b.buffer as ArrayBuffer))]) : r;
    },
  });
}

export class WorkerStageBackend<I> implements StageBackend {
  readonly kind: StageBackend['kind'];
  readonly forwardRows?: StageBackend['forwardRows'];
  readonly forwardBatch?: (steps: readonly BatchStep[]) => Promise<Array<ForwardResult | RowsForwardResult>>;
  private readonly stats = new Map<string, SessionStats>();
  private loadedInfo: I | null = null;
  private disposed = false;
  private dead: MeshError | null = null;
  private readonly failCode: ErrorCode;

  private constructor(
    private readonly remote: Comlink.Remote<StageWorkerApi<I>>,
    private readonly died: Promise<never>,
    private readonly stop: () => unknown,
    spec: WorkerEngineSpec,
  ) {
    this.kind = spec.kind;
    this.failCode = spec.failCode;
    died.catch((e: MeshError) => (this.dead = e)); // and observed through `call`
    if (spec.forwardRows) this.forwardRows = (sessionId, input, position, outDtype) => this.rows(sessionId, input, position, outDtype);
    if (spec.forwardBatch) this.forwardBatch = (steps) => this.batch(steps);
  }

  /**
   * A backend computing behind `endpoint` (a page's module worker, a node's worker thread),
   * which answers StageWorkerApi; `died` rejects (with `spec.failCode`) when that worker fails,
   * and every call in flight and after fails with it instead of hanging; `stop` ends the worker.
   */
  static over<I>(endpoint: Comlink.Endpoint, died: Promise<never>, stop: () => unknown, spec: WorkerEngineSpec): WorkerStageBackend<I> {
    return new WorkerStageBackend<I>(Comlink.wrap<StageWorkerApi<I>>(endpoint), died, stop, spec);
  }

  /** what the engine told of itself when it loaded (null before) */
  get info(): I | null {
    return this.loadedInfo;
  }

  async load(source: TensorSource, shard: ShardRange): Promise<void> {
    if (this.loadedInfo) throw new MeshError('ALREADY_LOADED', 'this backend already holds a shard; dispose it first');
    const model = { header: source.header, location: source.location, shard: { ...shard } };
    this.loadedInfo = await this.call(this.remote.load(model, readerOver(source, this.failCode)));
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    this.stats.set(sessionId, await this.call(this.remote.openSession(sessionId, options.contextLength)));
  }

  async releaseSession(sessionId: string): Promise<void> {
    await this.call(this.remote.releaseSession(sessionId));
    this.stats.delete(sessionId);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    this.stats.set(sessionId, await this.call(this.remote.truncateSession(sessionId, position)));
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const { result, stats } = await this.call(this.remote.forward(sessionId, input, position));
    this.stats.set(sessionId, stats);
    return result;
  }

  sessionStats(sessionId: string): SessionStats {
    const s = this.stats.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return { ...s, processedTokens: [...s.processedTokens] };
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    try {
      // a dead worker holds nothing any more
      if (!this.dead) await this.call(this.remote.dispose());
    } finally {
      this.stats.clear();
      this.remote[Comlink.releaseProxy]();
      this.stop();
    }
  }

  private async rows(sessionId: string, input: StageInput | HiddenRows, position: number, outDtype: 'f16' | 'f32'): Promise<RowsForwardResult> {
    const { result, stats } = await this.call(this.remote.forwardRows(sessionId, input, position, outDtype));
    this.stats.set(sessionId, stats);
    return result;
  }

  /** the engine's forwardBatch in the worker: each step's result its own forward's */
  private async batch(steps: readonly BatchStep[]): Promise<Array<ForwardResult | RowsForwardResult>> {
    const { results, stats } = await this.call(this.remote.forwardBatch([...steps]));
    steps.forEach((s, i) => this.stats.set(s.sessionId, stats[i]!));
    return results;
  }

  private async call<T>(p: Promise<WireResult<T>>): Promise<T> {
    return fromWire(await Promise.race([p, this.died]));
  }
}
