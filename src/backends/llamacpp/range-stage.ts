// llama.cpp serving one layer range as a StageBackend, with llama.cpp's own kernels: the
// shard's verified tensors are written into a shard GGUF (shard-gguf.ts), llama.cpp loads it
// (memory-mapped; the file is unlinked once mapped, so nothing is left behind), and each
// session is a llama_context of its own over it (range-context.ts): one sequence, one KV
// cache, freed exactly when the session closes.
//
// Stage 0 looks its token rows up in the real embedding table, kept here, with ggml's own
// to_float (what llama.cpp's get_rows runs), straight into the batch's embedding input;
// later stages take hidden states there. Sessions are admitted while the stage's memory
// budget holds the shard's weights plus every session's KV, compute and output buffers as
// llama.cpp allocates them.

import { randomBytes } from 'node:crypto';
import { mkdir, unlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MeshError } from '../../errors.ts';
import { GgmlType, TYPE_TRAITS } from '../../gguf/types.ts';
import type { TensorSource } from '../../gguf/types.ts';
import { configFromHeader } from '../../model/config.ts';
import type { ModelConfig } from '../../model/config.ts';
import { shardHasHead, validateShard } from '../shard.ts';
import { checkTruncate } from '../types.ts';
import type { ForwardResult, HiddenRows, RowsForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from '../types.ts';
import { LLAMACPP_RANGE_ARCHITECTURES } from './architectures.ts';
import { LlamaModelFfi, llamaBindings } from './ffi.ts';
import type { Bindings, KvType } from './ffi.ts';
import { LlamaRangeContext } from './range-context.ts';
import type { RowWriter } from './range-context.ts';
import { planShardGguf, writeShardGguf } from './shard-gguf.ts';

export interface LlamaCppRangeOptions {
  threads?: number;
  /** default false: exact attention */
  flashAttention?: boolean;
  /** KV cache element type (default 'f32') */
  kvType?: KvType;
  /** bytes this stage may hold: weights + every session's buffers (default: unlimited) */
  memoryBytes?: number;
  /** where the shard GGUF is written before llama.cpp maps it (default: the OS temp dir) */
  workDir?: string;
}

interface Loaded {
  config: ModelConfig;
  shard: ShardRange;
  model: LlamaModelFfi;
  /** stage 0: the token embedding table's bytes and a row converter */
  embedding: { bytes: Uint8Array; rowBytes: number; toFloat: (src: Uint8Array, dst: Float32Array, n: number) => void } | null;
  hasHead: boolean;
  /** bytes of the shard's tensors (what the planner counted against the node's memory) */
  tensorBytes: number;
}

let traitsType: unknown = null;
let toFloatProto: unknown = null;

/** ggml's `to_float` for `type` (the dequantiser llama.cpp's get_rows uses), callable from JS. */
function ggmlToFloat(b: Bindings, type: GgmlType): (src: Uint8Array, dst: Float32Array, n: number) => void {
  const { koffi } = b;
  // F32 rows are copied (ggml's get_rows memcpys them; F32 has no to_float)
  if (type === GgmlType.F32) return (src, dst) => new Uint8Array(dst.buffer, dst.byteOffset, dst.byteLength).set(src);
  // ggml.h `struct ggml_type_traits`, up to to_float
  traitsType ??= koffi.struct('gm_ggml_type_traits', { type_name: 'void *', blck_size: 'int64_t', blck_size_interleave: 'int64_t', type_size: 'size_t', is_quantized: 'bool', to_float: 'void *' });
  toFloatProto ??= koffi.proto('void gm_to_float_t(const void *x, void *y, int64_t k)');
  const traits = koffi.decode(b.fn.type_traits!(type) as never, traitsType as never) as { to_float: unknown };
  if (!traits.to_float) throw new MeshError('UNSUPPORTED_TENSOR_TYPE', `ggml has no to_float for type ${type}`);
  return (src, dst, n) => koffi.call(traits.to_float as never, toFloatProto as never, src, dst, n);
}

export class LlamaCppRangeStage implements StageBackend {
  readonly kind = 'llamacpp' as const;
  private loaded: Loaded | null = null;
  private b: Bindings | null = null;
  private readonly sessions = new Map<string, LlamaRangeContext>();
  /** per-session buffer bytes llama.cpp allocated besides the KV cache (compute, output), learnt from the first session */
  private sessionOverhead = 0;

  constructor(private readonly options: LlamaCppRangeOptions = {}) {}

  async load(source: TensorSource, shard: ShardRange): Promise<void> {
    if (this.loaded) throw new MeshError('ALREADY_LOADED', 'this backend already holds a shard; dispose it first');
    const arch = String(source.header.metadata['general.architecture']);
    if (!LLAMACPP_RANGE_ARCHITECTURES.includes(arch)) {
      throw new MeshError('UNSUPPORTED_SHARD', `the llama.cpp range path serves ${LLAMACPP_RANGE_ARCHITECTURES.join(', ')}, not '${arch}' layers [${shard.start}, ${shard.end}) (a whole '${arch}' model runs on llama.cpp as one stage)`);
    }
    const config = configFromHeader(source.header);
    validateShard(shard, config.nLayer);
    const b = (this.b = await llamaBindings());
    const plan = planShardGguf(source.header, shard, config.nLayer);
    const wanted = plan.tensors.flatMap((t) => (t.from ? [t.from] : [])).concat(plan.embedding ? [plan.embedding] : []);
    const bytes = await source.read(wanted);
    const dir = this.options.workDir ?? join(tmpdir(), 'gguf-mesh-llamacpp');
    await mkdir(dir, { recursive: true });
    const path = join(dir, `shard-${shard.start}-${shard.end}-${process.pid}-${randomBytes(4).toString('hex')}.gguf`);
    let model: LlamaModelFfi;
    try {
      await writeShardGguf(path, plan, bytes);
      model = await LlamaModelFfi.load(path);
    } finally {
      // mapped (or failed): the file is not needed any more
      await unlink(path).catch(() => undefined);
    }
    let embedding: Loaded['embedding'] = null;
    if (plan.embedding) {
      const t = plan.embedding;
      embedding = { bytes: bytes.get(t.name)!, rowBytes: t.byteLength / t.shape[1]!, toFloat: ggmlToFloat(b, t.type) };
      if (!TYPE_TRAITS[t.type]) throw new MeshError('UNSUPPORTED_TENSOR_TYPE', `token embedding type ${t.type} is unknown`);
    }
    const tensorBytes = wanted.reduce((a, t) => a + t.byteLength, 0);
    this.loaded = { config, shard: { ...shard }, model, embedding, hasHead: shardHasHead(shard, config.nLayer), tensorBytes };
  }

  /**
   * bytes of weights this stage holds: llama.cpp's model buffers (the mapped file and the
   * kernels' repacked copies, both counted) and stage 0's embedding table
   */
  get weightBytes(): number {
    const l = this.live();
    return l.model.bufferBytes + (l.embedding?.bytes.byteLength ?? 0);
  }

  /** bytes of the shard's tensors as read from the artifact */
  get shardBytes(): number {
    return this.live().tensorBytes;
  }

  /** the weight bytes by buffer ('CPU_Mapped model', 'AMX model', …, 'embedding table') */
  get weightBuffers(): Record<string, number> {
    const l = this.live();
    return { ...l.model.buffers, ...(l.embedding ? { 'embedding table': l.embedding.bytes.byteLength } : {}) };
  }

  /** bytes held for every open session: KV caches, and the compute and output buffers llama.cpp reported */
  get sessionBytes(): number {
    let sum = 0;
    for (const s of this.sessions.values()) sum += this.kvBytes(s.contextLength) + (s.buffers.compute ?? 0) + (s.buffers.output ?? 0);
    return sum;
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    const l = this.live();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    if (!Number.isSafeInteger(options.contextLength) || options.contextLength <= 0) {
      throw new MeshError('BAD_CONTEXT_LENGTH', `context length must be a positive integer, got ${options.contextLength}`);
    }
    // the budget is the node's --memory; its weights count as the planner counted them (the
    // shard's tensor bytes: llama.cpp's mapped file and repacked copies hold the same data)
    const budget = this.options.memoryBytes ?? Infinity;
    const needs = this.kvBytes(options.contextLength) + this.sessionOverhead;
    const held = l.tensorBytes + this.sessionBytes;
    if (held + needs > budget) {
      throw new MeshError(
        'STAGE_MEMORY_FULL',
        `session ${sessionId} needs about ${needs} bytes (KV for ${options.contextLength} positions); this stage holds ${held} of its ${budget}-byte budget (${this.sessions.size} sessions open)`,
        { needs, held, budget, sessions: this.sessions.size },
      );
    }
    const ctx = new LlamaRangeContext(this.b!, l.model, {
      ...this.options,
      contextLength: options.contextLength,
      nEmbd: l.config.nEmbd,
      nBlocks: l.shard.end - l.shard.start,
      hasHead: l.hasHead,
    });
    this.sessionOverhead = Math.max(this.sessionOverhead, (ctx.buffers.compute ?? 0) + (ctx.buffers.output ?? 0));
    this.sessions.set(sessionId, ctx);
  }

  async releaseSession(sessionId: string): Promise<void> {
    this.session(sessionId).dispose();
    this.sessions.delete(sessionId);
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const rows: StageInput | HiddenRows =
      input.kind === 'hidden'
        ? { kind: 'rows', dtype: 'f32', bytes: new Uint8Array(input.hidden.buffer, input.hidden.byteOffset, input.hidden.byteLength), nTokens: input.nTokens, width: input.hidden.length / Math.max(1, input.nTokens) }
        : input;
    const { output, computeMs } = await this.forwardRows(sessionId, rows, position, 'f32');
    if (output.kind === 'logits') return { output, computeMs };
    return { output: { kind: 'hidden', hidden: new Float32Array(output.bytes.buffer, output.bytes.byteOffset, output.bytes.byteLength / 4), nTokens: output.nTokens }, computeMs };
  }

  async forwardRows(sessionId: string, input: StageInput | HiddenRows, position: number, outDtype: 'f16' | 'f32'): Promise<RowsForwardResult> {
    const l = this.live();
    const ctx = this.session(sessionId);
    if (position !== ctx.position) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${ctx.position}, forward was asked for position ${position}`, { expected: ctx.position, got: position });
    }
    const started = performance.now();
    const { nTokens, write } = this.rowWriter(l, input);
    const nEmbd = l.config.nEmbd;
    const out: HiddenRows | null = l.hasHead ? null : { kind: 'rows', dtype: outDtype, bytes: new Uint8Array(nTokens * nEmbd * (outDtype === 'f16' ? 2 : 4)), nTokens, width: nEmbd };
    const logits = ctx.decode(nTokens, write, out);
    const computeMs = performance.now() - started;
    return { output: out ?? { kind: 'logits', logits: logits! }, computeMs };
  }

  /** How the input's rows reach the batch: embedding lookups on stage 0, hidden rows after it. */
  private rowWriter(l: Loaded, input: StageInput | HiddenRows): { nTokens: number; write: RowWriter } {
    const { nEmbd, nVocab } = l.config;
    const { shard } = l;
    if (input.kind === 'tokens') {
      const emb = l.embedding;
      if (!emb) throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) takes hidden states, not token ids`);
      for (const t of input.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= nVocab) throw new MeshError('BAD_TOKEN', `token id ${t} is outside the vocabulary [0, ${nVocab})`);
      }
      const write: RowWriter = (dst, first, count) => {
        for (let i = 0; i < count; i++) {
          const row = input.tokens[first + i]! * emb.rowBytes;
          emb.toFloat(emb.bytes.subarray(row, row + emb.rowBytes), dst.subarray(i * nEmbd, (i + 1) * nEmbd), nEmbd);
        }
      };
      return { nTokens: input.tokens.length, write };
    }
    if (l.embedding) throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) starts at layer 0 and takes token ids`);
    if (input.kind === 'hidden') throw new MeshError('BAD_STAGE_INPUT', 'internal: hidden states reach forwardRows as rows');
    if (input.width !== nEmbd) {
      throw new MeshError('FRAME_BAD_WIDTH', `frame width: hidden states of ${input.width} per token, but layers [${shard.start}, ${shard.end}) take n_embd = ${nEmbd}`, { field: 'width', expected: nEmbd, got: input.width });
    }
    const elt = input.dtype === 'f16' ? 2 : 4;
    if (input.bytes.byteLength !== input.nTokens * nEmbd * elt) {
      throw new MeshError('BAD_STAGE_INPUT', `hidden states hold ${input.bytes.byteLength} bytes, expected ${input.nTokens} × ${nEmbd} × ${elt}`);
    }
    const b = this.b!;
    const write: RowWriter = (dst, first, count) => {
      const src = input.bytes.subarray(first * nEmbd * elt, (first + count) * nEmbd * elt);
      if (input.dtype === 'f16') b.fn.fp16_to_fp32_row!(src, dst, count * nEmbd);
      else new Uint8Array(dst.buffer, dst.byteOffset, count * nEmbd * 4).set(src);
    };
    return { nTokens: input.nTokens, write };
  }

  sessionStats(sessionId: string): SessionStats {
    const ctx = this.session(sessionId);
    const l = this.live();
    return { position: ctx.position, kvBytes: this.kvBytes(ctx.contextLength), processedTokens: new Array<number>(l.shard.end - l.shard.start).fill(ctx.position) };
  }

  /** Graph nodes llama.cpp offered the eval callback in the session's last step (0 on the last stage, which captures nothing). */
  nodesOffered(sessionId: string): number {
    return this.session(sessionId).nodesOffered;
  }

  /** Forgets a session's positions from `position` on (its KV cache keeps [0, position)). */
  rollbackSession(sessionId: string, position: number): void {
    this.session(sessionId).rollback(position);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    const s = this.session(sessionId);
    checkTruncate(sessionId, position, s.position);
    s.rollback(position);
  }

  async dispose(): Promise<void> {
    for (const s of this.sessions.values()) s.dispose();
    this.sessions.clear();
    this.loaded?.model.dispose();
    this.loaded = null;
  }

  /** KV bytes llama.cpp allocates for a context of `contextLength` positions (K and V per block, cells padded to 256) */
  private kvBytes(contextLength: number): number {
    const { config, shard } = this.live();
    const cells = Math.ceil(contextLength / 256) * 256;
    const perElement = { f32: 4, f16: 2, q8_0: 34 / 32, q4_0: 18 / 32 }[this.options.kvType ?? 'f32'];
    return Math.round(2 * (shard.end - shard.start) * cells * config.nHeadKv * config.headDim * perElement);
  }

  private live(): Loaded {
    if (!this.loaded) throw new MeshError('NOT_LOADED', 'no shard is loaded; call load() first');
    return this.loaded;
  }

  private session(sessionId: string): LlamaRangeContext {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return s;
  }
}
