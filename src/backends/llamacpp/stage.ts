// llama.cpp as a StageBackend holding every layer, from the artifact's own file: token ids in,
// last-position logits out, for any architecture llama.cpp loads (a layer range is
// range-stage.ts). Each session is one llama.cpp context with its own KV cache. Runs through
// ./ffi.ts because node-llama-cpp does not hand out raw logits.

import { MeshError } from '../../errors.ts';
import { isUrl } from '../../gguf/parse.ts';
import type { GgufHeader, TensorSource } from '../../gguf/types.ts';
import { metadataNumber } from '../../gguf/metadata.ts';
import { hyperParameters } from '../../gguf/summary.ts';
import type { HyperParameters } from '../../gguf/summary.ts';
import { checkTruncate } from '../types.ts';
import type { ForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from '../types.ts';
import { LlamaModelFfi, defaultLlamaThreads } from './ffi.ts';
import type { LlamaContextFfi, LlamaContextOptions } from './ffi.ts';

export type LlamaCppStageOptions = Omit<LlamaContextOptions, 'contextLength' | 'capture' | 'embeddings'>;

interface Session {
  ctx: LlamaContextFfi;
  processed: number;
}

export class LlamaCppStage implements StageBackend {
  readonly kind = 'llamacpp' as const;
  private model: LlamaModelFfi | null = null;
  private config: HyperParameters | null = null;
  private header: GgufHeader | null = null;
  private readonly sessions = new Map<string, Session>();

  constructor(private readonly options: LlamaCppStageOptions = {}) {}

  /** CPU threads each session's llama_decode runs on (the option, else llama.cpp's default here) */
  get threads(): number {
    return this.options.threads ?? defaultLlamaThreads();
  }

  async load(source: TensorSource, shard: ShardRange): Promise<void> {
    const config = hyperParameters(source.header, source.location);
    if (shard.start !== 0 || shard.end !== config.n_layer) {
      throw new MeshError(
        'UNSUPPORTED_SHARD',
        `this llama.cpp stage serves whole models (layer ranges: LlamaCppRangeStage): asked for layers [${shard.start}, ${shard.end}) of ${config.n_layer}`,
      );
    }
    if (isUrl(source.location)) {
      throw new MeshError('LLAMACPP_LOCAL_ONLY', `llama.cpp loads local files only, not ${source.location}`);
    }
    this.model = await LlamaModelFfi.load(source.location);
    this.config = config;
    this.header = source.header;
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    const model = this.live();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    const ctx = model.createContext({ ...this.options, contextLength: options.contextLength, batchSize: Math.min(options.contextLength, 512) });
    this.sessions.set(sessionId, { ctx, processed: 0 });
  }

  async releaseSession(sessionId: string): Promise<void> {
    this.session(sessionId).ctx.dispose();
    this.sessions.delete(sessionId);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    const s = this.session(sessionId);
    checkTruncate(sessionId, position, s.ctx.position);
    s.ctx.truncate(position);
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const s = this.session(sessionId);
    if (input.kind !== 'tokens') throw new MeshError('BAD_STAGE_INPUT', 'the llama.cpp stage takes token ids');
    if (position !== s.ctx.position) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${s.ctx.position}, forward was asked for position ${position}`, {
        expected: s.ctx.position,
        got: position,
      });
    }
    const started = performance.now();
    const logits = s.ctx.decode(input.tokens);
    s.processed += input.tokens.length;
    return { output: { kind: 'logits', logits }, computeMs: performance.now() - started };
  }

  sessionStats(sessionId: string): SessionStats {
    const s = this.session(sessionId);
    const cfg = this.config!;
    const kvBytesPerElement = { f32: 4, f16: 2, q8_0: 34 / 32, q4_0: 18 / 32 }[this.options.kvType ?? 'f32'];
    const at = (v: number | number[], l: number): number => (Array.isArray(v) ? (v[l] ?? 0) : v);
    const headDim = metadataNumber(this.header!.metadata[`${cfg.architecture}.attention.key_length`]) ?? cfg.n_embd / Math.max(1, at(cfg.n_head, 0));
    let kvHeads = 0; // summed over layers
    for (let l = 0; l < cfg.n_layer; l++) kvHeads += at(cfg.n_head_kv, l);
    return {
      position: s.ctx.position,
      // K and V for every layer and every position of the context (for plain attention models)
      kvBytes: Math.round(2 * kvHeads * s.ctx.contextLength * headDim * kvBytesPerElement),
      processedTokens: new Array<number>(cfg.n_layer).fill(s.processed),
    };
  }

  async dispose(): Promise<void> {
    for (const s of this.sessions.values()) s.ctx.dispose();
    this.sessions.clear();
    this.model?.dispose();
    this.model = null;
  }

  private live(): LlamaModelFfi {
    if (!this.model) throw new MeshError('NOT_LOADED', 'no model is loaded; call load() first');
    return this.model;
  }

  private session(sessionId: string): Session {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return s;
  }
}
