// The CPU reference StageBackend: one shard in f32, a KV cache per session, and the forward
// pass of ./forward.ts. Slow but exact; every other backend is compared with it.

import { MeshError } from '../../errors.ts';
import type { TensorSource } from '../../gguf/types.ts';
import { configFromHeader, loadRopeFreqFactors } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { shardHasEmbedding, shardHasHead, validateShard } from '../shard.ts';
import { checkTruncate } from '../types.ts';
import type { BatchStep, ForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput, StageOutput } from '../types.ts';
import { forwardSessions } from './batch-forward.ts';
import { MAX_BATCH, embed, forwardLayers, lastLogits, rowLogits } from './forward.ts';
import { KvCache } from './kv-cache.ts';
import type { WorkerFactory } from './compute-pool.ts';
import { RecurrentState } from './recurrent-state.ts';
import { sharedMemoryAvailable } from './wasm-arena.ts';
import type { MemoryAdvisor } from './wasm-arena.ts';
import { loadShardWeights } from './weights.ts';
import type { ActivationRounding, ShardWeights, WeightStorage } from './weights.ts';

export interface CpuBackendOptions {
  /** 'auto' (default): Q8_0/Q4_0 as int8, the rest f32; 'f32': all dequantised; 'quantized': the file's bytes */
  weightStorage?: WeightStorage;
  /** 'ggml' (default) rounds activations like llama.cpp for quantised weights; 'none' is exact f32 */
  activationRounding?: ActivationRounding;
  /** multiply f32 matrices with the WebAssembly SIMD kernel (default true; false = JS loops) */
  simd?: boolean;
  /**
   * threads that run the kernels (default 1): this one and threads − 1 workers started by
   * `workers` over a shared memory (ignored where memory cannot be shared)
   */
  threads?: number;
  /** starts a worker thread (./node-threads.ts in Node; Blob URL workers in an isolated page) */
  workers?: WorkerFactory;
  /** told of the engine's memory when it is made for the weights (Node: asks for huge pages) */
  adviseMemory?: MemoryAdvisor;
}

export class CpuBackend implements StageBackend {
  readonly kind = 'cpu' as const;
  private loaded: { config: ModelConfig; shard: ShardRange; weights: ShardWeights } | null = null;
  private readonly sessions = new Map<string, KvCache>();

  constructor(private readonly options: CpuBackendOptions = {}) {}

  async load(source: TensorSource, shard: ShardRange): Promise<void> {
    if (this.loaded) throw new MeshError('ALREADY_LOADED', 'this backend already holds a shard; dispose it first');
    const config = configFromHeader(source.header);
    validateShard(shard, config.nLayer);
    await loadRopeFreqFactors(config, source);
    const { threads = 1, workers, simd = true } = this.options;
    const shared = threads > 1 && workers !== undefined && simd && sharedMemoryAvailable();
    const advise = this.options.adviseMemory;
    const weights = await loadShardWeights(source, config, shard, this.options.weightStorage ?? 'auto', this.options.activationRounding ?? 'ggml', simd, { shared, ...(advise ? { advise } : {}) });
    if (shared && weights.arena.simd) weights.arena.startThreads(threads - 1, workers);
    // the matmuls' staging sits beside the weights, so a session's KV cache ends the memory and
    // grows where it is (./kv-cache.ts)
    weights.arena.staging(weights.staging(MAX_BATCH));
    this.loaded = { config, shard: { ...shard }, weights };
  }

  /** the loaded model's hyper-parameters */
  get config(): ModelConfig {
    return this.model().config;
  }

  get shard(): ShardRange {
    return this.model().shard;
  }

  /** bytes of weights held in memory */
  get weightBytes(): number {
    return this.model().weights.bytes;
  }

  /** threads the kernels run on */
  get threads(): number {
    return this.model().weights.arena.threads;
  }

  /** bytes of the engine's memory (weights, KV caches, activations, free space) */
  get memoryBytes(): number {
    return this.model().weights.arena.capacity;
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    const { config, shard } = this.model();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    if (!Number.isSafeInteger(options.contextLength) || options.contextLength <= 0) {
      throw new MeshError('BAD_CONTEXT_LENGTH', `context length must be a positive integer, got ${options.contextLength}`);
    }
    const recurrent = config.recurrentLayers.slice(shard.start, shard.end);
    const attends = config.linearAttention ? recurrent.map((r) => !r) : undefined;
    const kv = new KvCache(this.model().weights.arena, shard.end - shard.start, config.nHeadKv, config.headDim, options.contextLength, attends);
    // Gated DeltaNet layers: a fixed-size state per session instead of keys and values
    if (config.linearAttention) kv.recurrent = new RecurrentState(config.linearAttention, recurrent);
    this.sessions.set(sessionId, kv);
  }

  async releaseSession(sessionId: string): Promise<void> {
    this.session(sessionId).free();
    this.sessions.delete(sessionId);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    const kv = this.session(sessionId);
    checkTruncate(sessionId, position, kv.length);
    // recurrent state first (within its chunk, to its checkpoint or to 0, else POSITION_MISMATCH,
    // changing nothing), then the keys and values
    this.rewind(sessionId, kv, position);
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const { config, shard, weights } = this.model();
    const kv = this.atPosition(sessionId, position);
    const started = performance.now();
    // the kernel threads wake while the input is read, and rest after: another stage may want the cores
    return weights.arena.pass(() => {
      const { x, n } = this.residual(input); // the residual stream [n × nEmbd]
      if (n === 0) throw new MeshError('BAD_STAGE_INPUT', 'forward needs at least one token');
      try {
        forwardLayers(config, weights, kv, x, n);
      } catch (e) {
        // a forward that failed part-way (maybe after some of its batches) must not leave some
        // layers' recurrent state or keys advanced: back to where it started
        this.rewind(sessionId, kv, position);
        throw e;
      }
      const output: StageOutput = shardHasHead(shard, config.nLayer)
        ? { kind: 'logits', logits: lastLogits(config, weights, x, n) }
        : { kind: 'hidden', hidden: x, nTokens: n };
      return { output, computeMs: performance.now() - started };
    });
  }

  /**
   * One-token steps of distinct sessions as one pass (./batch-forward.ts): each result the same
   * bit for bit as that step's own `forward`; every step is checked before any computes, and a
   * failure part-way rewinds every session to where it was. computeMs: the whole pass's.
   */
  async forwardBatch(steps: readonly BatchStep[]): Promise<ForwardResult[]> {
    const { config, shard, weights } = this.model();
    if (new Set(steps.map((s) => s.sessionId)).size !== steps.length) throw new MeshError('BAD_STAGE_INPUT', 'a batch holds one step per session');
    const kvs = steps.map((s) => this.atPosition(s.sessionId, s.position));
    return weights.arena.pass(() => {
      const started = performance.now();
      const x = new Float32Array(steps.length * config.nEmbd); // [B × nEmbd], row i = step i
      steps.forEach((s, i) => {
        if (s.input.kind === 'rows') throw new MeshError('BAD_STAGE_INPUT', 'internal: encoded rows for a backend that takes f32');
        const r = this.residual(s.input);
        if (r.n !== 1) throw new MeshError('BAD_STAGE_INPUT', `a batched step is one token, session ${s.sessionId} sent ${r.n}`);
        x.set(r.x, i * config.nEmbd);
      });
      const outputs: StageOutput[] = [];
      for (let b0 = 0; b0 < steps.length; b0 += MAX_BATCH) {
        const b1 = Math.min(steps.length, b0 + MAX_BATCH);
        const rows = x.subarray(b0 * config.nEmbd, b1 * config.nEmbd);
        try {
          forwardSessions(config, weights, kvs.slice(b0, b1), rows);
        } catch (e) {
          steps.forEach((s, i) => this.rewind(s.sessionId, kvs[i]!, s.position));
          throw e;
        }
        if (shardHasHead(shard, config.nLayer)) for (const logits of rowLogits(config, weights, rows, b1 - b0)) outputs.push({ kind: 'logits', logits });
        else for (let i = 0; i < b1 - b0; i++) outputs.push({ kind: 'hidden', hidden: rows.slice(i * config.nEmbd, (i + 1) * config.nEmbd), nTokens: 1 });
      }
      const computeMs = performance.now() - started;
      return outputs.map((output) => ({ output, computeMs }));
    });
  }

  sessionStats(sessionId: string): SessionStats {
    const kv = this.session(sessionId);
    return { position: kv.length, kvBytes: kv.bytes, processedTokens: [...kv.processedTokens], ...(kv.recurrent ? { recurrentBytes: kv.recurrent.bytes } : {}) };
  }

  /** ids of the open sessions */
  sessionIds(): string[] {
    return [...this.sessions.keys()];
  }

  async dispose(): Promise<void> {
    for (const kv of this.sessions.values()) kv.free();
    this.sessions.clear();
    this.loaded?.weights.arena.dispose();
    this.loaded = null;
  }

  private model(): { config: ModelConfig; shard: ShardRange; weights: ShardWeights } {
    if (!this.loaded) throw new MeshError('NOT_LOADED', 'no shard is loaded; call load() first');
    return this.loaded;
  }

  private session(sessionId: string): KvCache {
    const kv = this.sessions.get(sessionId);
    if (!kv) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return kv;
  }

  /** the session's cache, which must be at `position` (never a silent recompute) */
  private atPosition(sessionId: string, position: number): KvCache {
    const kv = this.session(sessionId);
    if (position !== kv.length) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${kv.length}, forward was asked for position ${position}`, {
        expected: kv.length,
        got: position,
      });
    }
    return kv;
  }

  /** back to `position` after a failed forward: recurrent state (to its checkpoint), keys and values */
  private rewind(sessionId: string, kv: KvCache, position: number): void {
    kv.recurrent?.rewind(sessionId, position);
    kv.truncate(position);
  }

  /** The input as the residual stream's first rows [n × nEmbd]: token embeddings (first stage) or a copy of the hidden states. */
  private residual(input: StageInput): { x: Float32Array; n: number } {
    const { config, shard, weights } = this.model();
    if (input.kind === 'tokens') {
      if (!shardHasEmbedding(shard)) {
        throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) takes hidden states, not token ids`);
      }
      for (const t of input.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= config.nVocab) {
          throw new MeshError('BAD_TOKEN', `token id ${t} is outside the vocabulary [0, ${config.nVocab})`);
        }
      }
      const n = input.tokens.length;
      return { x: n > 0 ? embed(weights.tokenEmbd!, input.tokens, config.nEmbd, config.embedScale) : new Float32Array(0), n };
    }
    if (shardHasEmbedding(shard)) {
      throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) starts at layer 0 and takes token ids`);
    }
    const n = input.nTokens;
    if (input.hidden.length !== n * config.nEmbd) {
      throw new MeshError('BAD_STAGE_INPUT', `hidden states hold ${input.hidden.length} floats, expected ${n} × ${config.nEmbd}`);
    }
    return { x: input.hidden.slice(), n };
  }
}
