// A pool of sessions of a llama.cpp layer range: one llama_context over a shard GGUF
// (shard-gguf.ts) whose `slots` sequences are sessions, each with `cells` KV cells of its own
// (kv_unified off: a stream per sequence, n_ctx = slots × cells), so a session's attention runs
// over its own cells laid out as in a context of its own, whatever the others hold. One-token
// steps of several sessions go through one llama_decode, each row with its session's sequence
// id and position (`decodeRows`); a prefill is one session's rows (`decode`). A pool that
// grows (or, emptied to a quarter, shrinks) copies its sessions' cells into another (`adopt`). Hidden states go in through the batch's embedding input and, on
// every stage but the last, come out of the last block's output `l_out-(n-1)`, read in
// llama.cpp's eval callback — which then stops the graph, so the stub output norm and head
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

/** One session's one-token step in `decodeRows`: its sequence, its position, its row's writer and where its hidden state goes. */
export interface PoolRow {
  slot: number;
  position: number;
  write: RowWriter;
  /** one row (stages without the head) */
  out: EncodedRows | null;
}

export interface RangePoolOptions extends Omit<LlamaContextOptions, 'capture' | 'embeddings' | 'contextLength'> {
  /** KV cells of each sequence (llama.cpp pads them to 256) */
  cells: number;
  /** sequences (sessions) the context holds */
  slots: number;
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

/** Takes one captured `l_out` tensor (f32 rows of one ubatch, in batch order); false when its rows do not fit. */
type Sink = (data: unknown, rows: number) => boolean;

/**
 * One sequence's saved state (llama_state_seq_get_data) made loadable into a context of
 * `streams` streams: llama.cpp loads a sequence only into a cache of as many streams as it
 * was saved from ("n_stream mismatch"), though all but one of them are empty. The layout, as
 * llama.cpp 0.4.0 writes it (llama_context::state_seq_get_data, llama_kv_cache::state_write):
 * u32 magic, i32 seq_id, u32 n_stream, then per stream a u32 cell count and, where it is not 0,
 * that stream's cells. Returns the state with n_stream = `streams` and the one stream that has
 * cells first; null when no stream has any (nothing to copy); 'unknown' when the bytes are not
 * laid out so. A hand-written rewrite because llama.cpp has no call that copies a sequence
 * between contexts.
 */
export function restreamed(state: Uint8Array, streams: number): Uint8Array | null | 'unknown' {
  if (state.byteLength < 12) return 'unknown';
  const v = new DataView(state.buffer, state.byteOffset, state.byteLength);
  const n = v.getUint32(8, true);
  if (n < 1 || state.byteLength < 12 + 4 * n) return 'unknown';
  for (let s = 0, at = 12; s < n; s++, at += 4) {
    if (v.getUint32(at, true) === 0) continue;
    // the empty streams after it are its last 4 × (n − 1 − s) bytes
    const end = state.byteLength - 4 * (n - 1 - s);
    if (end <= at + 4 || state.subarray(end).some((x) => x !== 0)) return 'unknown';
    const out = new Uint8Array(12 + (end - at) + 4 * (streams - 1));
    out.set(state.subarray(0, 8));
    new DataView(out.buffer).setUint32(8, streams, true);
    out.set(state.subarray(at, end), 12);
    return out;
  }
  return state.byteLength === 12 + 4 * n ? null : 'unknown';
}

/**
 * Most sequences between two rows of a batch that placeholder rows fill (`decodeRows`): a
 * placeholder costs about what a batched row does, a second graph about what a step alone does
 * (it reads the weights again) — about two batched rows on 2 cores (measured: 1.19 ms a step
 * alone, 0.51–0.67 ms a row in batches of 4–32, 8×512 Q8_0) — and more on a machine where
 * reading the weights is what a step costs.
 */
export const FILL_HOLE = 3;

export class LlamaRangePool {
  readonly cells: number;
  readonly slots: number;
  /** bytes llama.cpp allocated for this context, by kind (KV, compute, output), as it logged them (to 0.01 MiB) */
  readonly buffers: Record<string, number>;
  /** graph nodes llama.cpp offered the eval callback during the last decode (what the capture costs: one JS call each) */
  nodesOffered = 0;
  private ptr: unknown;
  private readonly batch: Batch;
  private readonly batchSize: number;
  private readonly embd: Float32Array;
  private readonly pos: Int32Array;
  private readonly seqIds: Int32Array[];
  private readonly outputs: Int8Array;
  private readonly taken: boolean[];
  private callback: unknown = null;
  /** where the running decode's captured rows go */
  private sink: Sink | null = null;
  private captured = 0;

  constructor(
    private readonly b: Bindings,
    readonly model: LlamaModelFfi,
    private readonly opts: RangePoolOptions,
  ) {
    this.cells = opts.cells;
    this.slots = opts.slots;
    const p = contextParams(b, { ...opts, contextLength: opts.cells, sequences: opts.slots, batchSize: opts.batchSize ?? Math.min(opts.cells, 512) });
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
    // one sequence id per token, set per decode (llama_batch_init leaves them unset)
    const ids = koffi.decode(this.batch.seq_id as never, koffi.array('void *', this.batchSize)) as unknown[];
    this.seqIds = ids.map((id) => view(id, 4, (buf) => new Int32Array(buf)));
    this.taken = new Array<boolean>(opts.slots).fill(false);
  }

  /** sequences in use */
  get used(): number {
    return this.taken.filter(Boolean).length;
  }

  /** The lowest free sequence id, now in use, or -1 when every one is. */
  take(): number {
    const slot = this.taken.indexOf(false);
    if (slot >= 0) this.taken[slot] = true;
    return slot;
  }

  /** Frees sequence `slot`: its cells emptied, the id free for another session. */
  give(slot: number): void {
    this.rollback(slot, 0);
    this.taken[slot] = false;
  }

  /** Takes sequence `slot` of `from` (another pool, same cells): its KV cells copied into this pool's sequence `to`. */
  adopt(from: LlamaRangePool, slot: number, to = slot): void {
    const { fn } = this.b;
    const size = Number(fn.state_seq_get_size!(from.live(), slot));
    const data = new Uint8Array(size);
    const fail = (why: string) => new MeshError('LLAMACPP_CONTEXT_FAILED', `llama.cpp could not move sequence ${slot} into sequence ${to} of a pool of ${this.slots}: ${why}`);
    if (Number(fn.state_seq_get_data!(from.live(), data, size, slot)) !== size) throw fail(this.b.recentErrors.join(' | ') || 'no state');
    const moved = restreamed(data, this.slots);
    if (moved === 'unknown') throw fail('its saved state is not laid out as llama.cpp 0.4.0 (node-llama-cpp 3.21.1) lays it out');
    if (moved && Number(fn.state_seq_set_data!(this.live(), moved, moved.byteLength, to)) === 0) throw fail(this.b.recentErrors.join(' | ') || 'no reason given');
    this.taken[to] = true;
  }

  /**
   * Runs `nTokens` rows of sequence `slot` at positions [position, position + nTokens): `write`
   * fills the batch's embeddings chunk by chunk. Returns the hidden states after the shard's
   * last block in `out` (stages without the head) or the last position's logits (the last
   * stage). A failure drops whatever part of it reached the KV cache.
   */
  decode(slot: number, position: number, nTokens: number, write: RowWriter, out: EncodedRows | null): Float32Array | null {
    const ctx = this.live();
    const { nEmbd, hasHead } = this.opts;
    if (nTokens <= 0) throw new MeshError('BAD_STAGE_INPUT', 'decode needs at least one token');
    if (!hasHead && !out) throw new MeshError('BAD_STAGE_INPUT', 'a stage without the head needs somewhere to put its hidden states');
    let logits: Float32Array | null = null;
    try {
      for (let first = 0; first < nTokens; first += this.batchSize) {
        const count = Math.min(this.batchSize, nTokens - first);
        write(this.embd.subarray(0, count * nEmbd), first, count);
        for (let i = 0; i < count; i++) {
          this.pos[i] = position + first + i;
          this.seqIds[i]![0] = slot;
        }
        // hidden states of every row, or the logits of the very last one
        const lastChunk = first + count === nTokens;
        this.outputs.fill(hasHead ? 0 : 1, 0, count);
        if (hasHead && lastChunk) this.outputs[count - 1] = 1;
        let offset = first * nEmbd;
        this.run(ctx, count, out && ((data, rows) => {
          if (offset + rows * nEmbd > (first + count) * nEmbd) return false;
          this.writeRows(data, 0, rows, out, offset);
          offset += rows * nEmbd;
          return true;
        }));
        if (hasHead && lastChunk) logits = this.readLogits(ctx, count - 1);
      }
    } catch (e) {
      this.rollback(slot, position);
      throw e;
    }
    return logits;
  }

  /**
   * One token of each row's sequence at its position, all in one llama_decode: hidden states
   * into each row's `out` (stages without the head) or each row's logits (the last stage), in
   * the rows' order. With a stream per sequence llama.cpp computes a batch as one graph only
   * while its sequence ids run consecutively (llama_batch_allocr::split_equal cuts it where they
   * skip, and each graph reads the weights again), so rows go in slot order and a hole of up to
   * FILL_HOLE sequences between them is filled with placeholder rows — a zero row at the hole
   * sequence's next position (`nextPosition`: null where its cells are full), dropped from its
   * cells afterwards, which puts llama.cpp's search for free cells back where it was. A failure
   * drops every row from the KV cache.
   */
  decodeRows(rows: readonly PoolRow[], nextPosition: (slot: number) => number | null): Float32Array[] {
    const ctx = this.live();
    const { nEmbd, hasHead } = this.opts;
    if (rows.length === 0 || rows.length > this.batchSize) throw new MeshError('BAD_STAGE_INPUT', `a pool's batch holds 1 to ${this.batchSize} rows, not ${rows.length}`);
    const plan = this.batchPlan(rows, nextPosition); // distinct slots: at most `slots` ≤ batchSize entries
    plan.forEach((e, i) => {
      const dst = this.embd.subarray(i * nEmbd, (i + 1) * nEmbd);
      if (e.row >= 0) rows[e.row]!.write(dst, 0, 1);
      else dst.fill(0);
      this.pos[i] = e.position;
      this.seqIds[i]![0] = e.slot;
      // hidden states of every row (the last block keeps only output rows), logits of the real ones
      this.outputs[i] = !hasHead || e.row >= 0 ? 1 : 0;
    });
    let next = 0;
    try {
      this.run(ctx, plan.length, hasHead ? null : (data, n) => {
        if (next + n > plan.length) return false;
        for (let j = 0; j < n; j++) {
          const r = plan[next + j]!.row;
          if (r >= 0) this.writeRows(data, j, 1, rows[r]!.out!, 0);
        }
        next += n;
        return true;
      });
      const logits: Float32Array[] = new Array(rows.length);
      if (hasHead) plan.forEach((e, i) => e.row >= 0 && (logits[e.row] = this.readLogits(ctx, i)));
      for (const e of plan) if (e.row < 0) this.rollback(e.slot, e.position);
      return logits;
    } catch (e) {
      for (const p of plan) this.rollback(p.slot, p.position);
      throw e;
    }
  }

  /** The batch's rows in slot order (`row`: index into `rows`, -1 for a placeholder), holes of up to FILL_HOLE sequences filled. */
  private batchPlan(rows: readonly PoolRow[], nextPosition: (slot: number) => number | null): Array<{ row: number; slot: number; position: number }> {
    const plan: Array<{ row: number; slot: number; position: number }> = [];
    for (const r of rows.map((_, i) => i).sort((x, y) => rows[x]!.slot - rows[y]!.slot)) {
      const { slot, position } = rows[r]!;
      const prev = plan.at(-1)?.slot;
      if (prev !== undefined && slot - prev - 1 <= FILL_HOLE) {
        const fill = [];
        for (let s = prev + 1; s < slot; s++) {
          const p = this.taken[s] ? nextPosition(s) : 0;
          if (p === null || p >= this.cells) break;
          fill.push({ row: -1, slot: s, position: p });
        }
        if (fill.length === slot - prev - 1) plan.push(...fill);
      }
      plan.push({ row: r, slot, position });
    }
    return plan;
  }

  /** Forgets positions [position, …) of sequence `slot`. */
  rollback(slot: number, position: number): void {
    this.b.fn.memory_seq_rm!(this.b.fn.get_memory!(this.live()), slot, position, -1);
  }

  dispose(): void {
    if (this.ptr) {
      this.b.fn.batch_free!(this.batch);
      this.b.fn.free!(this.ptr);
    }
    this.ptr = null;
    this.unregister();
  }

  /** One llama_decode of the batch's first `count` rows, its captured rows into `sink` (every row, or it fails). */
  private run(ctx: unknown, count: number, sink: Sink | null): void {
    this.batch.n_tokens = count;
    this.sink = sink;
    this.captured = 0;
    this.b.recentErrors.length = 0;
    this.nodesOffered = 0;
    try {
      const rc = Number(this.b.fn.decode!(ctx, this.batch));
      if (rc !== 0) throw new MeshError('LLAMACPP_DECODE_FAILED', `llama_decode returned ${rc}: ${this.b.recentErrors.join(' | ')}`);
      if (sink && this.captured !== count) {
        throw new MeshError('LLAMACPP_NO_OUTPUT', `llama.cpp's graph gave ${this.captured} of ${count} rows of l_out-${this.opts.nBlocks - 1} to read the hidden states from`);
      }
    } finally {
      this.sink = null;
    }
  }

  /** Rows [first, first + n) of a captured f32 tensor into `dst` from element `at`, in dst's dtype. */
  private writeRows(data: unknown, first: number, n: number, dst: EncodedRows, at: number): void {
    const { nEmbd } = this.opts;
    const src = new Float32Array(this.b.koffi.view(data as never, (first + n) * nEmbd * 4) as ArrayBuffer, first * nEmbd * 4, n * nEmbd);
    if (dst.dtype === 'f16') this.b.fn.fp32_to_fp16_row!(src, dst.bytes.subarray(at * 2, (at + n * nEmbd) * 2), n * nEmbd);
    else dst.bytes.set(new Uint8Array(src.buffer, src.byteOffset, src.byteLength), at * 4);
  }

  /** The eval callback: asks for the last block's output only, hands it to the sink, and stops the graph. */
  private onTensor(t: unknown, ask: boolean): boolean {
    if (ask) this.nodesOffered++;
    const name = this.b.fn.tensor_name!(t) as string;
    if (name !== `l_out-${this.opts.nBlocks - 1}`) return false;
    if (ask) return true;
    const sink = this.sink;
    if (!sink) return false;
    const nbytes = Number(this.b.fn.tensor_nbytes!(t));
    const rows = nbytes / (this.opts.nEmbd * 4);
    // rows that do not fit leave `captured` short: run() reports it
    if (Number.isInteger(rows) && sink(this.b.fn.tensor_data!(t), rows)) this.captured += rows;
    return false; // nothing after the last block is needed
  }

  private readLogits(ctx: unknown, i: number): Float32Array {
    const ptr = this.b.fn.get_logits_ith!(ctx, i);
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
