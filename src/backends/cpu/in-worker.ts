// The CPU engine behind a dedicated worker: a page's stage when the tab has no WebGPU (or is
// told to use the CPU). The page reads the shard's verified tensors and transfers them with
// the header; the worker (workers/cpu-stage.worker.ts) builds a CpuBackend over them and
// answers every call as a WireResult, so error codes survive the thread hop. Session stats
// come back with each forward, so sessionStats stays synchronous as StageBackend wants.

import * as Comlink from 'comlink';
import { MeshError } from '../../errors.ts';
import type { GgufHeader, TensorSource } from '../../gguf/types.ts';
import { configFromHeader } from '../../model/config.ts';
import { shardTensors, validateShard } from '../shard.ts';
import type { BatchStep, ForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from '../types.ts';
import { fromWire } from '../wire.ts';
import type { WireResult } from '../wire.ts';

/** what the worker loads: the header and the shard's tensor bytes (transferred) */
export interface CpuStageModel {
  header: GgufHeader;
  location: string;
  shard: ShardRange;
  tensors: { name: string; bytes: Uint8Array }[];
}

export interface CpuWorkerInfo {
  /** threads the engine computes on (more than 1 only in a cross-origin-isolated page) */
  threads: number;
  /** whether the fused multiply-add kernels run (relaxed SIMD) */
  relaxedSimd: boolean;
}

/** What the CPU stage worker answers over comlink. */
export interface CpuWorkerApi {
  load(model: CpuStageModel): Promise<WireResult<CpuWorkerInfo>>;
  openSession(sessionId: string, contextLength: number): Promise<WireResult<SessionStats>>;
  releaseSession(sessionId: string): Promise<WireResult<void>>;
  truncateSession(sessionId: string, position: number): Promise<WireResult<SessionStats>>;
  forward(sessionId: string, input: StageInput, position: number): Promise<WireResult<{ result: ForwardResult; stats: SessionStats }>>;
  forwardBatch(steps: BatchStep[]): Promise<WireResult<{ results: ForwardResult[]; stats: SessionStats[] }>>;
  dispose(): Promise<WireResult<void>>;
}

export class CpuWorkerBackend implements StageBackend {
  readonly kind = 'cpu' as const;
  private readonly stats = new Map<string, SessionStats>();
  private loadedInfo: CpuWorkerInfo | null = null;
  private disposed = false;

  private constructor(
    private readonly remote: Comlink.Remote<CpuWorkerApi>,
    private readonly stop: () => unknown,
    private readonly died: Promise<never>,
  ) {}

  /**
   * A backend computing behind `endpoint` (a page's module worker, a node's worker thread);
   * `died` rejects with CPU_WORKER_FAILED when that worker fails, and every call in flight and
   * after fails with it instead of hanging; `stop` ends the worker.
   */
  static over(endpoint: Comlink.Endpoint, died: Promise<never>, stop: () => unknown): CpuWorkerBackend {
    died.catch(() => {}); // observed through `call`
    return new CpuWorkerBackend(Comlink.wrap<CpuWorkerApi>(endpoint), stop, died);
  }

  /**
   * A backend computing in `worker`, a module worker started from workers/cpu-stage.worker.ts
   * (workers/cpu-stage.ts does both). If the worker dies, every call in flight and after fails
   * with CPU_WORKER_FAILED instead of hanging.
   */
  static inWorker(worker: Worker): CpuWorkerBackend {
    const died = new Promise<never>((_, reject) => {
      const fail = (what: string) => reject(new MeshError('CPU_WORKER_FAILED', `the CPU stage worker failed: ${what}`));
      worker.addEventListener('error', (e) => {
        e.preventDefault();
        fail(e.message || 'it could not start or threw outside a call');
      });
      worker.addEventListener('messageerror', () => fail('a message could not be deserialised'));
    });
    return CpuWorkerBackend.over(worker, died, () => worker.terminate());
  }

  /** threads and kernels the worker computes with (after load) */
  get info(): CpuWorkerInfo | null {
    return this.loadedInfo;
  }

  /** Reads the shard's tensors here and transfers them (they are detached here afterwards). */
  async load(source: TensorSource, shard: ShardRange): Promise<void> {
    if (this.loadedInfo) throw new MeshError('ALREADY_LOADED', 'this backend already holds a shard; dispose it first');
    validateShard(shard, configFromHeader(source.header).nLayer);
    const infos = shardTensors(source.header, shard, configFromHeader(source.header).nLayer);
    const bytes = await source.read(infos);
    const tensors = infos.map((t) => ({ name: t.name, bytes: bytes.get(t.name)! }));
    const buffers = [...new Set(tensors.map((t) => t.bytes.buffer as ArrayBuffer))];
    const model: CpuStageModel = { header: source.header, location: source.location, shard: { ...shard }, tensors };
    this.loadedInfo = await this.call(this.remote.load(Comlink.transfer(model, buffers)));
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

  /** the engine's forwardBatch in the worker (./batch-forward.ts): each step's result its own forward's */
  async forwardBatch(steps: readonly BatchStep[]): Promise<ForwardResult[]> {
    const { results, stats } = await this.call(this.remote.forwardBatch([...steps]));
    steps.forEach((s, i) => this.stats.set(s.sessionId, stats[i]!));
    return results;
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
      await this.call(this.remote.dispose());
    } finally {
      this.stats.clear();
      this.remote[Comlink.releaseProxy]();
      this.stop();
    }
  }

  private async call<T>(p: Promise<WireResult<T>>): Promise<T> {
    return fromWire(await Promise.race([p, this.died]));
  }
}
