// The WebGPU StageBackend. It reads the shard's tensors from the TensorSource where it runs
// (the page, or Node) and hands their bytes to a StageEngine: normally a dedicated Web Worker
// that owns the GPUDevice (workers/webgpu-stage.worker.ts, over comlink), or a stage in this
// thread (Node with Dawn). Session positions are mirrored here so sessionStats stays
// synchronous, as the StageBackend interface wants.

import * as Comlink from 'comlink';
import { MeshError } from '../../errors.ts';
import type { TensorSource } from '../../gguf/types.ts';
import { configFromHeader, loadRopeFreqFactors, ROPE_FACTOR_TENSORS } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { shardTensors, validateShard } from '../shard.ts';
import type { BatchStep, ForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from '../types.ts';
import type { AdapterSummary } from './device.ts';
import { fromWire } from './engine.ts';
import type { BufferStats, StageEngine, WireResult, WorkerApi } from './engine.ts';
import { quantKindOf } from './shader-library.ts';
import type { KvType } from './shader-library.ts';
import { CHUNK } from '../cpu/delta-chunk.ts';
import { gpuDeltaLayerBytes } from './delta-net.ts';
import { kvCapacity } from './kv-capacity.ts';
import { batchesShard } from './rows-attention.ts';
import type { StageModel, StageTensor, WebGpuStageOptions } from './stage.ts';

interface MirroredSession {
  position: number;
  contextLength: number;
  /** positions the stage's cache holds (it grows as the stage's does: kvCapacity) */
  capacity: number;
  processedTokens: number[];
  /** Qwen3.5: whether the stage holds a rewind checkpoint of the DeltaNet state (session-recurrent.ts's rules) */
  checkpointed: boolean;
}

export class WebGpuBackend implements StageBackend {
  readonly kind = 'webgpu' as const;
  private config: ModelConfig | null = null;
  private shard: ShardRange | null = null;
  private readonly sessions = new Map<string, MirroredSession>();
  /** what the stage reported after dispose, once the engine (and its worker) are gone */
  private finalStats: BufferStats | null = null;
  /**
   * One-token steps of distinct sessions as one pass, each result the bits of that step's own
   * `forward`; a failure changes no session. Set by `load` where the shard batches
   * (rows-attention.ts batchesShard: no Gated DeltaNet or expert layers); absent otherwise, so
   * the stage service runs those shards' steps one by one.
   */
  forwardBatch?: (steps: readonly BatchStep[]) => Promise<ForwardResult[]>;

  constructor(
    private readonly engine: StageEngine,
    private readonly onDispose: () => void = () => {},
    /** the stage's KV element type, for kvBytes */
    private readonly kvType: KvType = 'f32',
  ) {}

  /**
   * A backend whose GPU work runs in `worker`, a dedicated module worker the caller started
   * from workers/webgpu-stage.worker.ts (workers/webgpu-stage.ts does both). Tensor bytes are transferred to the
   * worker (their ArrayBuffers are detached here afterwards) unless `copyTensorBytes` is set,
   * for callers that keep using the bytes they loaded from. If the worker dies (a script error,
   * a crash), every call in flight and after fails with WEBGPU_WORKER_FAILED instead of hanging.
   */
  static async inWorker(worker: Worker, options: WebGpuStageOptions = {}, { copyTensorBytes = false }: { copyTensorBytes?: boolean } = {}): Promise<WebGpuBackend> {
    const remote = Comlink.wrap<WorkerApi>(worker);
    const died = new Promise<never>((_, reject) => {
      const fail = (what: string) => reject(new MeshError('WEBGPU_WORKER_FAILED', `the WebGPU worker failed: ${what}`));
      worker.addEventListener('error', (e) => {
        e.preventDefault();
        fail(e.message || 'it could not start or threw outside a call');
      });
      worker.addEventListener('messageerror', () => fail('a message could not be deserialised'));
    });
    died.catch(() => {}); // observed through `call`; never an unhandled rejection
    try {
      const adapter = fromWire(await Promise.race([remote.init(options), died]));
      return new WebGpuBackend(
        workerEngine(remote, adapter, copyTensorBytes, died),
        () => {
          remote[Comlink.releaseProxy]();
          worker.terminate();
        },
        options.kvType,
      );
    } catch (e) {
      worker.terminate();
      throw e;
    }
  }

  get adapter(): AdapterSummary {
    return this.engine.adapter;
  }

  /** live GPU buffers of the stage (both 0 after dispose) */
  async bufferStats(): Promise<BufferStats> {
    return this.finalStats ?? this.engine.bufferStats();
  }

  /** resolves with why the GPU device was lost while this stage held its shard (never after dispose) */
  deviceLost(): Promise<string> {
    return this.engine.whenLost();
  }

  async load(source: TensorSource, shard: ShardRange): Promise<void> {
    if (this.config) throw new MeshError('ALREADY_LOADED', 'this backend already holds a shard; dispose it first');
    const config = configFromHeader(source.header);
    validateShard(shard, config.nLayer);
    await loadRopeFreqFactors(config, source);
    const infos = shardTensors(source.header, shard, config.nLayer).filter((t) => !ROPE_FACTOR_TENSORS.includes(t.name));
    // refuse unsupported types before reading a byte
    for (const t of infos) if (t.shape.length > 1) quantKindOf(t.type, `tensor ${t.name}`);
    const bytes = await source.read(infos);
    const tensors: StageTensor[] = infos.map((t) => {
      const b = bytes.get(t.name)!;
      if (b.byteLength === 0 && t.byteLength > 0 && b.buffer.byteLength === 0) {
        // a buffer transferred to another worker reads as empty here
        throw new MeshError('TENSOR_BYTES_DETACHED', `the bytes of ${t.name} were already handed to a WebGPU worker (they are transferred, not copied): read them again, or load with copyTensorBytes`);
      }
      return { name: t.name, type: t.type, shape: [...t.shape], bytes: b };
    });
    const model: StageModel = { config, shard: { ...shard }, artifact: source.location, tensors };
    await this.engine.load(model);
    this.config = config;
    this.shard = { ...shard };
    if (batchesShard(config, shard)) this.forwardBatch = (steps) => this.batch(steps);
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    const c = this.loaded();
    await this.engine.openSession(sessionId, options.contextLength);
    const nLayers = this.shard!.end - this.shard!.start;
    this.sessions.set(sessionId, {
      position: 0,
      contextLength: options.contextLength,
      capacity: kvCapacity(0, 1, options.contextLength),
      processedTokens: new Array<number>(nLayers).fill(0),
      checkpointed: false,
    });
  }

  async releaseSession(sessionId: string): Promise<void> {
    await this.engine.releaseSession(sessionId);
    this.sessions.delete(sessionId);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    await this.engine.truncateSession(sessionId, position);
    const s = this.sessions.get(sessionId)!;
    // a rewind behind the current chunk restored or dropped the checkpoint
    if (Math.floor(position / CHUNK) < Math.floor(s.position / CHUNK)) s.checkpointed = false;
    s.position = position;
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const result = await this.engine.forward(sessionId, input, position);
    this.advanced(sessionId, position, input.kind === 'tokens' ? input.tokens.length : input.nTokens);
    return result;
  }

  private async batch(steps: readonly BatchStep[]): Promise<ForwardResult[]> {
    const engineSteps = steps.map(({ sessionId, input, position }) => {
      if (input.kind === 'rows') throw new MeshError('BAD_STAGE_INPUT', 'internal: encoded rows for a backend that takes f32');
      return { sessionId, input, position };
    });
    const results = await this.engine.forwardBatch(engineSteps);
    for (const s of steps) this.advanced(s.sessionId, s.position, 1);
    return results;
  }

  /** the mirror of a session whose forward of n tokens at `position` succeeded */
  private advanced(sessionId: string, position: number, n: number): void {
    const s = this.sessions.get(sessionId)!;
    // a forward that folds a chunk checkpoints the DeltaNet state first
    if ((position % CHUNK) + n >= CHUNK) s.checkpointed = true;
    s.position = position + n;
    s.capacity = kvCapacity(s.capacity, s.position, s.contextLength);
    for (let l = 0; l < s.processedTokens.length; l++) s.processedTokens[l]! += n;
  }

  sessionStats(sessionId: string): SessionStats {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    const c = this.loaded();
    const recurrent = c.recurrentLayers.slice(this.shard!.start, this.shard!.end).filter(Boolean).length;
    const kvLayers = s.processedTokens.length - recurrent;
    const kvBytes = 2 * kvLayers * s.capacity * c.nHeadKv * c.headDim * (this.kvType === 'f16' ? 2 : 4);
    const stats: SessionStats = { position: s.position, kvBytes, processedTokens: [...s.processedTokens] };
    if (c.linearAttention) stats.recurrentBytes = recurrent * gpuDeltaLayerBytes(c.linearAttention) * (s.checkpointed ? 2 : 1);
    return stats;
  }

  async dispose(): Promise<void> {
    if (this.finalStats) return;
    try {
      await this.engine.dispose();
      this.finalStats = await this.engine.bufferStats();
    } finally {
      this.finalStats ??= { count: NaN, bytes: NaN };
      this.sessions.clear();
      this.config = null;
      this.onDispose();
    }
  }

  private loaded(): ModelConfig {
    if (!this.config) throw new MeshError('NOT_LOADED', 'no shard is loaded; call load() first');
    return this.config;
  }
}

/** The worker's comlink proxy as a StageEngine; tensor and activation bytes are transferred, not copied. */
function workerEngine(remote: Comlink.Remote<WorkerApi>, adapter: AdapterSummary, copyTensorBytes: boolean, died: Promise<never>): StageEngine {
  const call = async <T>(p: Promise<WireResult<T>>): Promise<T> => fromWire(await Promise.race([p, died]));
  return {
    adapter,
    load: (model) => {
      if (copyTensorBytes) model = { ...model, tensors: model.tensors.map((t) => ({ ...t, bytes: t.bytes.slice() })) };
      const buffers = [...new Set(model.tensors.map((t) => t.bytes.buffer as ArrayBuffer))];
      return call(remote.load(Comlink.transfer(model, buffers)));
    },
    openSession: (id, ctx) => call(remote.openSession(id, ctx)),
    releaseSession: (id) => call(remote.releaseSession(id)),
    truncateSession: (id, position) => call(remote.truncateSession(id, position)),
    forward: (id, input, position) => call(remote.forward(id, input, position)),
    forwardBatch: (steps) => call(remote.forwardBatch(steps)),
    bufferStats: () => call(remote.bufferStats()),
    whenLost: () => call(remote.whenLost()),
    dispose: () => call(remote.dispose()),
  };
}
