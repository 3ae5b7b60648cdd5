// The CPU reference StageBackend: one shard in f32, a KV cache per session, and the forward
// pass of ./forward.ts. Slow but exact; every other backend is compared with it.

import { MeshError } from '../../errors.ts';
import type { TensorSource } from '../../gguf/types.ts';
import { configFromHeader, loadRopeFreqFactors } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { shardHasEmbedding, shardHasHead, validateShard } from '../shard.ts';
import { checkTruncate } from '../types.ts';
import type { ForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput, StageOutput } from '../types.ts';
import { embed, forwardLayers, lastLogits } from './forward.ts';
import { KvCache } from './kv-cache.ts';
import { RecurrentState } from './recurrent-state.ts';
import { loadShardWeights } from './weights.ts';
import type { ActivationRounding, ShardWeights, WeightStorage } from './weights.ts';

export interface CpuBackendOptions {
  /** 'auto' (default): Q8_0/Q4_0 as int8, the rest f32; 'f32': all dequantised; 'quantized': the file's bytes */
  weightStorage?: WeightStorage;
  /** 'ggml' (default) rounds activations like llama.cpp for quantised weights; 'none' is exact f32 */
  activationRounding?: ActivationRounding;
  /** multiply f32 matrices with the WebAssembly SIMD kernel (default true; false = JS loops) */
  simd?: boolean;
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
    const weights = await loadShardWeights(source, config, shard, this.options.weightStorage ?? 'auto', this.options.activationRounding ?? 'ggml', this.options.simd ?? true);
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

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    const { config, shard } = this.model();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    if (!Number.isSafeInteger(options.contextLength) || options.contextLength <= 0) {
      throw new MeshError('BAD_CONTEXT_LENGTH', `context length must be a positive integer, got ${options.contextLength}`);
    }
    const recurrent = config.recurrentLayers.slice(shard.start, shard.end);
    const kv = new KvCache(shard.end - shard.start, config.nHeadKv * config.headDim, options.contextLength, config.linearAttention ? recurrent.map((r) => !r) : undefined);
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
    // recurrent state: within its chunk, to its checkpoint or to 0, else POSITION_MISMATCH
    kv.recurrent?.rewind(sessionId, position);
    kv.length = position;
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const { config, shard, weights } = this.model();
    const kv = this.session(sessionId);
    if (position !== kv.length) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${kv.length}, forward was asked for position ${position}`, {
        expected: kv.length,
        got: position,
      });
    }
    const started = performance.now();
    let x: Float32Array; // residual stream [n × nEmbd]
    let n: number;
    if (input.kind === 'tokens') {
      if (!shardHasEmbedding(shard)) {
        throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) takes hidden states, not token ids`);
      }
      n = input.tokens.length;
      for (const t of input.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= config.nVocab) {
          throw new MeshError('BAD_TOKEN', `token id ${t} is outside the vocabulary [0, ${config.nVocab})`);
        }
      }
      if (n > 0) x = embed(weights.tokenEmbd!, input.tokens, config.nEmbd, config.embedScale);
      else x = new Float32Array(0);
    } else {
      if (shardHasEmbedding(shard)) {
        throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) starts at layer 0 and takes token ids`);
      }
      n = input.nTokens;
      if (input.hidden.length !== n * config.nEmbd) {
        throw new MeshError('BAD_STAGE_INPUT', `hidden states hold ${input.hidden.length} floats, expected ${n} × ${config.nEmbd}`);
      }
      x = input.hidden.slice();
    }
    if (n === 0) throw new MeshError('BAD_STAGE_INPUT', 'forward needs at least one token');

    try {
      forwardLayers(config, weights, kv, x, n);
    } catch (e) {
      // a forward that failed part-way must not leave some layers' recurrent state advanced
      if (kv.length === position) kv.recurrent?.rewind(sessionId, position);
      throw e;
    }

    const output: StageOutput = shardHasHead(shard, config.nLayer)
      ? { kind: 'logits', logits: lastLogits(config, weights, x, n) }
      : { kind: 'hidden', hidden: x, nTokens: n };
    return { output, computeMs: performance.now() - started };
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
}
