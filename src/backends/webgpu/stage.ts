// The WebGPU stage engine: owns a GPUDevice, the shard's weights (shard-weights.ts), a KV cache
// per session (session-kv.ts) and the forward pass over them (forward-pass.ts). It runs wherever
// a device exists — a Web Worker (workers/webgpu-stage.worker.ts), a page, or Node with Dawn —
// and speaks plain data (typed arrays, numbers), so it can sit behind comlink unchanged. Here
// live what every call shares: one call at a time, argument checks, error scopes naming the
// shard, device loss and the lifetimes of everything the stage holds.

import { MeshError } from '../../errors.ts';
import { checkTruncate } from '../types.ts';
import type { ForwardResult, SessionStats, StageInput } from '../types.ts';
import type { AdapterSummary } from './device.ts';
import { withErrorScopes } from './error-scopes.ts';
import { ForwardPass } from './forward-pass.ts';
import { GpuMemory } from './gpu-memory.ts';
import { KernelLibrary, SubmitResources } from './kernels.ts';
import * as op from './ops.ts';
import { checkDeltaShapes } from './delta-net.ts';
import { batchesShard } from './rows-attention.ts';
import { kvParts, SessionKv } from './session-kv.ts';
import { SessionRecurrent } from './session-recurrent.ts';
import type { ShaderSources } from './shader-library.ts';
import { destroyShardWeights, shardLabel, uploadShardWeights } from './shard-weights.ts';
import type { ShardWeights, StageModel } from './shard-weights.ts';
import { chooseStageKernels, pipelinesFor } from './stage-kernels.ts';
import type { StageKernels, WebGpuStageOptions } from './stage-kernels.ts';

export type { StageModel, StageTensor } from './shard-weights.ts';
export type { WebGpuStageOptions } from './stage-kernels.ts';

export class WebGpuStage {
  private readonly memory: GpuMemory;
  private readonly library: KernelLibrary;
  private readonly resources: SubmitResources;
  private readonly kernels: StageKernels;
  private model: ShardWeights | null = null;
  private pass: ForwardPass | null = null;
  private readonly sessions = new Map<string, SessionKv>();
  private lost: string | null = null;
  /** resolves with why the device was lost (never once the stage is disposed): a serving peer hands its stage on */
  readonly lostReason: Promise<string>;
  /** calls run one at a time: they share scratch buffers, the readback buffer and error scopes */
  private tail: Promise<unknown> = Promise.resolve();
  private disposed = false;

  constructor(
    readonly device: GPUDevice,
    readonly adapter: AdapterSummary,
    sources: ShaderSources,
    private readonly options: WebGpuStageOptions = {},
  ) {
    this.memory = new GpuMemory(device);
    this.library = new KernelLibrary(device, sources);
    this.resources = new SubmitResources(this.memory);
    this.kernels = chooseStageKernels(adapter, options);
    this.lostReason = new Promise((resolve) => {
      void device.lost.then((info) => {
        if (this.disposed) return;
        this.lost = `${info.reason}: ${info.message}`;
        resolve(this.lost);
      });
    });
  }

  /** live GPU buffers and their bytes (0 and 0 after dispose) */
  bufferStats(): { count: number; bytes: number } {
    return { count: this.memory.count, bytes: this.memory.bytes };
  }

  /** queue submissions, bytes read back and weight bytes the kernels read since the stage was made */
  transferStats(): { submissions: number; readbackBytes: number; weightBytesRead: number } {
    return { submissions: this.resources.submissions, readbackBytes: this.resources.readbackBytes, weightBytesRead: this.resources.weightBytesRead };
  }

  /** labels of the compiled pipelines */
  pipelineLabels(): string[] {
    return this.library.labels;
  }

  load(model: StageModel): Promise<void> {
    return this.exclusive(() => this.loadNow(model));
  }

  private async loadNow(model: StageModel): Promise<void> {
    this.check();
    if (this.model) throw new MeshError('ALREADY_LOADED', 'this stage already holds a shard; dispose it first');
    if (model.config.headDim > op.ATTENTION_MAX_HEAD_DIM) {
      throw new MeshError('UNSUPPORTED_MODEL', `head dimension ${model.config.headDim} exceeds the WebGPU attention kernel's ${op.ATTENTION_MAX_HEAD_DIM}`);
    }
    if (model.config.linearAttention) checkDeltaShapes(model.config.linearAttention);
    const maxChunk = Math.min(this.options.maxChunkBytes ?? Infinity, this.adapter.maxStorageBufferBindingSize, this.adapter.maxBufferSize);
    const before = this.memory.snapshot();
    await this.guard(shardLabel(model), 'uploading weights', async () => {
      const weights = uploadShardWeights(this.memory, model, maxChunk);
      this.model = weights;
      // compiled now, in parallel, so a shader that fails to compile fails the load
      await this.library.prepare(pipelinesFor(weights, this.kernels));
      this.pass = new ForwardPass(this.memory, this.library, this.resources, weights, this.kernels);
    }).catch((e) => {
      // free everything uploaded so far, including a layer that was only half built
      this.model = null;
      this.pass = null;
      this.memory.destroyAllExcept(before);
      throw e;
    });
  }

  openSession(sessionId: string, contextLength: number): Promise<void> {
    return this.exclusive(() => this.openSessionNow(sessionId, contextLength));
  }

  private async openSessionNow(sessionId: string, contextLength: number): Promise<void> {
    this.check();
    const m = this.loadedModel();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    if (!Number.isSafeInteger(contextLength) || contextLength <= 0) {
      throw new MeshError('BAD_CONTEXT_LENGTH', `context length must be a positive integer, got ${contextLength}`);
    }
    const { nHeadKv, headDim } = m.config;
    // a layer's cache larger than one binding is split by KV heads (CONTEXT_TOO_LARGE when one head does not fit)
    const maxBinding = Math.min(this.options.maxKvBindingBytes ?? Infinity, this.adapter.maxStorageBufferBindingSize, this.adapter.maxBufferSize);
    const parts = kvParts(nHeadKv, headDim, this.kernels.kvElementBytes, contextLength, maxBinding);
    // Qwen3.5: DeltaNet layers hold a fixed-size recurrent state instead of keys and values
    const la = m.config.linearAttention;
    const recurrent = m.config.recurrentLayers.slice(m.shard.start, m.shard.end);
    const attends = la ? recurrent.map((r) => !r) : undefined;
    const kv = new SessionKv(this.memory, sessionId, contextLength, nHeadKv * headDim, this.kernels.kvElementBytes, m.layers.length, parts, headDim, attends);
    await this.guard(shardLabel(m), `allocating the KV cache of session ${sessionId}`, async () => {
      kv.allocate();
      if (la) kv.recurrent = new SessionRecurrent(this.memory, sessionId, la, recurrent);
    }).catch((e) => {
      kv.free();
      throw e;
    });
    this.sessions.set(sessionId, kv);
  }

  /** frees the session's KV cache once any call in flight has finished with it */
  releaseSession(sessionId: string): Promise<void> {
    return this.exclusive(async () => {
      this.session(sessionId).free();
      this.sessions.delete(sessionId);
    });
  }

  sessionStats(sessionId: string): SessionStats {
    return this.session(sessionId).stats();
  }

  /** forgets positions [position, current): attention reads only the first `position`; recurrent state rewinds by its rules (session-recurrent.ts) */
  truncateSession(sessionId: string, position: number): Promise<void> {
    return this.exclusive(async () => {
      const kv = this.session(sessionId);
      checkTruncate(sessionId, position, kv.position);
      kv.recurrent?.rewind(position);
      kv.position = position;
    });
  }

  forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    return this.exclusive(() => this.forwardNow(sessionId, input, position));
  }

  private async forwardNow(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    this.check();
    const m = this.loadedModel();
    const kv = this.session(sessionId);
    const n = this.checkInput(m, kv, sessionId, input, position);
    const started = performance.now();
    // a cache that grows in this pass is put back if the pass fails (its old buffers are intact: the copy never ran)
    const saved = kv.save();
    const output = await this.guard(shardLabel(m), `forward of session ${sessionId}`, () => this.pass!.run(kv, input, n, position)).catch((e) => {
      kv.restore(saved);
      // a forward that failed part-way must not leave the recurrent state advanced
      kv.recurrent?.abandon();
      throw e;
    });
    kv.commit(saved);
    kv.advance(n);
    kv.recurrent?.advance(n);
    return { output, computeMs: performance.now() - started };
  }

  /**
   * One-token steps of distinct sessions as one pass (ForwardPass.runBatch), each result the
   * bits of that step's own `forward`. Every step is checked before anything runs, and a pass
   * that fails leaves every session as it was (caches that grew are put back), so the caller
   * may run the steps one by one instead. computeMs: the whole pass's.
   */
  forwardBatch(steps: readonly { sessionId: string; input: StageInput; position: number }[]): Promise<ForwardResult[]> {
    return this.exclusive(() => this.forwardBatchNow(steps));
  }

  private async forwardBatchNow(steps: readonly { sessionId: string; input: StageInput; position: number }[]): Promise<ForwardResult[]> {
    this.check();
    const m = this.loadedModel();
    if (!batchesShard(m.config, m.shard)) {
      throw new MeshError('BATCH_UNSUPPORTED', `${shardLabel(m)} has Gated DeltaNet or expert layers, whose sessions' steps run one by one`);
    }
    if (steps.length === 0) throw new MeshError('BAD_STAGE_INPUT', 'a batch needs at least one step');
    if (new Set(steps.map((s) => s.sessionId)).size !== steps.length) throw new MeshError('BAD_STAGE_INPUT', 'a batch holds one step per session');
    const kvs = steps.map((s) => {
      const kv = this.session(s.sessionId);
      const n = this.checkInput(m, kv, s.sessionId, s.input, s.position);
      if (n !== 1) throw new MeshError('BAD_STAGE_INPUT', `a batched step is one token, session ${s.sessionId} sent ${n}`);
      return kv;
    });
    const started = performance.now();
    const saved = kvs.map((kv) => kv.save());
    const outputs = await this.guard(shardLabel(m), `a batch of ${steps.length} sessions' steps`, () => this.pass!.runBatch(steps.map((s, i) => ({ kv: kvs[i]!, input: s.input, position: s.position })))).catch((e) => {
      kvs.forEach((kv, i) => kv.restore(saved[i]!));
      throw e;
    });
    kvs.forEach((kv, i) => {
      kv.commit(saved[i]!);
      kv.advance(1);
    });
    const computeMs = performance.now() - started;
    return outputs.map((output) => ({ output, computeMs }));
  }

  /** The number of tokens in `input`, once it is known to fit the shard and the session. */
  private checkInput(m: ShardWeights, kv: SessionKv, sessionId: string, input: StageInput, position: number): number {
    const { config: c, shard } = m;
    if (position !== kv.position) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${kv.position}, forward was asked for position ${position}`, {
        expected: kv.position,
        got: position,
      });
    }
    const n = input.kind === 'tokens' ? input.tokens.length : input.nTokens;
    if (n === 0) throw new MeshError('BAD_STAGE_INPUT', 'forward needs at least one token');
    if (input.kind === 'tokens') {
      if (!m.tokenEmbd) throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) takes hidden states, not token ids`);
      for (const t of input.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= m.tokenEmbd.rows) {
          throw new MeshError('BAD_TOKEN', `token id ${t} is outside the vocabulary [0, ${m.tokenEmbd.rows})`);
        }
      }
    } else {
      if (m.tokenEmbd) throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) starts at layer 0 and takes token ids`);
      if (input.hidden.length !== n * c.nEmbd) {
        throw new MeshError('BAD_STAGE_INPUT', `hidden states hold ${input.hidden.length} floats, expected ${n} × ${c.nEmbd}`);
      }
    }
    if (position + n > kv.contextLength) {
      throw new MeshError('CONTEXT_FULL', `session context is full: ${position} positions held + ${n} new > context length ${kv.contextLength}`);
    }
    return n;
  }

  /** frees every buffer, after any call in flight has finished */
  dispose(): Promise<void> {
    return this.exclusive(() => this.disposeNow());
  }

  private async disposeNow(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    for (const s of this.sessions.values()) s.free();
    this.sessions.clear();
    if (this.model) destroyShardWeights(this.memory, this.model);
    this.model = null;
    this.pass?.dispose();
    this.pass = null;
    this.resources.dispose();
    this.memory.destroyAll();
  }

  // ── internals ──

  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.tail.then(fn, fn);
    this.tail = run.catch(() => undefined);
    return run;
  }

  private loadedModel(): ShardWeights {
    if (!this.model) throw new MeshError('NOT_LOADED', 'no shard is loaded; call load() first');
    return this.model;
  }

  private session(sessionId: string): SessionKv {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return s;
  }

  private check(): void {
    if (this.disposed) throw new MeshError('DISPOSED', 'this WebGPU stage was disposed');
    if (this.lost) {
      const where = this.model ? shardLabel(this.model) : 'no shard loaded';
      throw new MeshError('WEBGPU_DEVICE_LOST', `the WebGPU device was lost (${this.lost}); ${where} must be loaded again`);
    }
  }

  private guard<T>(where: string, doing: string, fn: () => Promise<T>): Promise<T> {
    return withErrorScopes(this.device, () => this.lost, where, doing, fn);
  }
}
