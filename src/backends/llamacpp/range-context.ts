// One session of a llama.cpp layer range: a llama_context (one sequence, its own KV cache)
// over a shard GGUF (shard-gguf.ts). Hidden states go in through the batch's embedding input
// and, on every stage but the last, come out of the last block's output `l_out-(n-1)`, read
// in llama.cpp's eval callback — which then stops the graph, so the stub output norm and head
// behind it are never computed. Every token of a batch is marked as an output, or the last
// block would keep only the output rows (llama.cpp's `inp_out_ids`) and hidden states would be
// lost.
//
// Rows move without intermediate copies: f16 frame rows are widened by ggml's own
// ggml_fp16_to_fp32_row straight into the batch's native embedding buffer, and the captured
// tensor is narrowed by ggml_fp32_to_fp16_row straight into the outgoing payload (f32 rows are
// one memcpy each way).

import { MeshError } from '../../errors.ts';
import { contextParams, loggedBuffers } from './ffi.ts';
import type { Bindings, LlamaContextOptions, LlamaModelFfi } from './ffi.ts';

/** Rows as frames carry them: [nTokens × width] f16 or f32, little-endian. */
export interface EncodedRows {
  dtype: 'f16' | 'f32';
  bytes: Uint8Array;
}

/** Writes `count` rows (first row index `first`) into `dst`, [count × nEmbd] f32 in native memory. */
export type RowWriter = (dst: Float32Array, first: number, count: number) => void;

export interface RangeContextOptions extends Omit<LlamaContextOptions, 'capture' | 'embeddings'> {
  contextLength: number;
  nEmbd: number;
  /** blocks in the shard */
  nBlocks: number;
  /** true on the last stage: logits out, no capture */
  hasHead: boolean;
}

interface Batch {
  n_tokens: number;
  token: unknown;
  embd: unknown;
  pos: unknown;
  n_seq_id: unknown;
  seq_id: unknown;
  logits: unknown;
}

export class LlamaRangeContext {
  /** next position (= tokens in this session's KV cache) */
  position = 0;
  readonly contextLength: number;
  /** bytes llama.cpp allocated for this context, by kind (KV, compute, output), as it logged them (to 0.01 MiB) */
  readonly buffers: Record<string, number>;
  private ptr: unknown;
  private readonly batch: Batch;
  private readonly batchSize: number;
  private readonly embd: Float32Array;
  private readonly pos: Int32Array;
  private readonly outputs: Int8Array;
  private callback: unknown = null;
  /** graph nodes llama.cpp offered the eval callback during the last decode (what the capture costs: one JS call each) */
  nodesOffered = 0;
  /** where the running decode's captured rows go */
  private sink: { rows: EncodedRows; offset: number; count: number; done: boolean } | null = null;

  constructor(
    private readonly b: Bindings,
    readonly model: LlamaModelFfi,
    private readonly opts: RangeContextOptions,
  ) {
    const p = contextParams(b, { ...opts, batchSize: opts.batchSize ?? Math.min(opts.contextLength, 512) });
    this.contextLength = p.n_ctx as number;
    this.batchSize = p.n_batch as number;
    if (!opts.hasHead) {
      this.callback = b.koffi.register((t: unknown, ask: boolean) => this.onTensor(t, ask), b.koffi.pointer(b.EvalCallback));
      p.cb_eval = this.callback;
    }
    b.recentErrors.length = 0;
    const made = loggedBuffers(b, () => b.fn.init_from_model!(model.live(), p));
    this.ptr = made.result;
    this.buffers = made.buffers;
    if (!this.ptr) {
      this.unregister();
      throw new MeshError('LLAMACPP_CONTEXT_FAILED', `llama.cpp could not create a context: ${b.recentErrors.join(' | ') || 'no reason given'}`);
    }
    const { koffi } = b;
    this.batch = b.fn.batch_init!(this.batchSize, opts.nEmbd, 1) as Batch;
    const view = <T>(ptr: unknown, bytes: number, make: (buf: ArrayBuffer) => T): T => make(koffi.view(ptr as never, bytes) as ArrayBuffer);
    this.embd = view(this.batch.embd, this.batchSize * opts.nEmbd * 4, (buf) => new Float32Array(buf));
    this.pos = view(this.batch.pos, this.batchSize * 4, (buf) => new Int32Array(buf));
    this.outputs = view(this.batch.logits, this.batchSize, (buf) => new Int8Array(buf));
    view(this.batch.n_seq_id, this.batchSize * 4, (buf) => new Int32Array(buf)).fill(1);
    // every token in sequence 0 (llama_batch_init leaves the ids unset)
    const seqIds = koffi.decode(this.batch.seq_id as never, koffi.array('void *', this.batchSize)) as unknown[];
    for (const id of seqIds) view(id, 4, (buf) => new Int32Array(buf)).fill(0);
  }

  /**
   * Runs `nTokens` rows at positions [position, position + nTokens): `write` fills the batch's
   * embeddings chunk by chunk. Returns the hidden states after the shard's last block in
   * `out` (stages without the head) or the last position's logits (the last stage).
   */
  decode(nTokens: number, write: RowWriter, out: EncodedRows | null): Float32Array | null {
    const ctx = this.live();
    if (nTokens <= 0) throw new MeshError('BAD_STAGE_INPUT', 'decode needs at least one token');
    if (this.position + nTokens > this.contextLength) {
      throw new MeshError('CONTEXT_FULL', `llama.cpp context is full: ${this.position} + ${nTokens} > ${this.contextLength}`);
    }
    if (!this.opts.hasHead && !out) throw new MeshError('BAD_STAGE_INPUT', 'a stage without the head needs somewhere to put its hidden states');
    const start = this.position;
    let logits: Float32Array | null = null;
    try {
      for (let first = 0; first < nTokens; first += this.batchSize) {
        const count = Math.min(this.batchSize, nTokens - first);
        write(this.embd.subarray(0, count * this.opts.nEmbd), first, count);
        for (let i = 0; i < count; i++) this.pos[i] = this.position + i;
        // hidden states of every row, or the logits of the very last one
        const lastChunk = first + count === nTokens;
        this.outputs.fill(this.opts.hasHead ? 0 : 1, 0, count);
        if (this.opts.hasHead && lastChunk) this.outputs[count - 1] = 1;
        this.batch.n_tokens = count;
        this.sink = out ? { rows: out, offset: first * this.opts.nEmbd, count: count * this.opts.nEmbd, done: false } : null;
        this.b.recentErrors.length = 0;
        this.nodesOffered = 0;
        const rc = Number(this.b.fn.decode!(ctx, this.batch));
        if (rc !== 0) throw new MeshError('LLAMACPP_DECODE_FAILED', `llama_decode returned ${rc}: ${this.b.recentErrors.join(' | ')}`);
        if (this.sink && !this.sink.done) {
          throw new MeshError('LLAMACPP_NO_OUTPUT', `llama.cpp's graph has no tensor l_out-${this.opts.nBlocks - 1} to read the hidden states from`);
        }
        this.position += count;
        if (this.opts.hasHead && lastChunk) logits = this.readLogits(ctx);
      }
    } catch (e) {
      // a failed step leaves the session where it was: drop whatever part of it reached the KV cache
      this.rollback(start);
      throw e;
    } finally {
      this.sink = null;
    }
    return logits;
  }

  /** Forgets positions [position, …) of this session's KV cache. */
  rollback(position: number): void {
    this.b.fn.memory_seq_rm!(this.b.fn.get_memory!(this.live()), 0, position, -1);
    this.position = Math.min(this.position, position);
  }

  dispose(): void {
    if (this.ptr) {
      this.b.fn.batch_free!(this.batch);
      this.b.fn.free!(this.ptr);
    }
    this.ptr = null;
    this.unregister();
  }

  /** The eval callback: asks for the last block's output only, copies it out, and stops the graph. */
  private onTensor(t: unknown, ask: boolean): boolean {
    if (ask) this.nodesOffered++;
    const name = this.b.fn.tensor_name!(t) as string;
    if (name !== `l_out-${this.opts.nBlocks - 1}`) return false;
    if (ask) return true;
    const sink = this.sink;
    if (!sink) return false;
    const nbytes = Number(this.b.fn.tensor_nbytes!(t));
    if (nbytes !== sink.count * 4) return false; // leaves sink.done false: decode() reports it
    const data = this.b.fn.tensor_data!(t);
    if (sink.rows.dtype === 'f16') {
      this.b.fn.fp32_to_fp16_row!(data, sink.rows.bytes.subarray(sink.offset * 2, (sink.offset + sink.count) * 2), sink.count);
    } else {
      sink.rows.bytes.set(new Uint8Array(this.b.koffi.view(data as never, nbytes) as ArrayBuffer), sink.offset * 4);
    }
    sink.done = true;
    return false; // nothing after the last block is needed
  }

  private readLogits(ctx: unknown): Float32Array {
    const ptr = this.b.fn.get_logits_ith!(ctx, -1);
    if (!ptr) throw new MeshError('LLAMACPP_NO_OUTPUT', `llama.cpp returned no logits: ${this.b.recentErrors.join(' | ')}`);
    // a copy: the buffer behind ptr is reused by the next decode
    return new Float32Array((this.b.koffi.view(ptr as never, this.model.nVocab * 4) as ArrayBuffer).slice(0));
  }

  private unregister(): void {
    if (this.callback) this.b.koffi.unregister(this.callback as never);
    this.callback = null;
  }

  private live(): unknown {
    if (!this.ptr) throw new MeshError('DISPOSED', 'llama.cpp context was disposed');
    return this.ptr;
  }
}
