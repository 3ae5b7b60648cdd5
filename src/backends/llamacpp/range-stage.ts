// llama.cpp serving one layer range as a StageBackend, with llama.cpp's own kernels: the
// shard's verified tensors are written into a shard GGUF (shard-gguf.ts), llama.cpp loads it
// (memory-mapped; the file is unlinked once mapped, so nothing is left behind), and each
// session is a sequence of a pool (range-pool.ts): a llama_context whose sequences each have
// KV cells of their own, so that concurrent sessions' one-token steps run as one llama_decode
// (`forwardBatch`).
//
// Memory: a llama.cpp context cannot grow its KV cache, so a pool reserves every sequence's
// cells (slots × cells) when it is made. Pools are made on demand, one size of cells each (the
// session's context length padded to 256, as llama.cpp pads it): a session takes a free sequence of a
// pool of its size; else the fullest such pool is remade with twice the sequences (up to
// POOL_SLOTS), its sessions' cells copied over (llama_state_seq_get/set_data), when the budget
// holds the old pool and the new one side by side; else it gets a pool of its own — one
// session's KV, compute and output buffers, as a session cost before pools. So a lone session
// is what it always was (one sequence, its own context), no node needs a flag, and a budget
// that admitted N sessions still does; batches form among sessions of one pool. An emptied
// pool is freed; a part-empty one keeps its cells (counted in sessionBytes) for the next
// session of its size.
//
// Stage 0 looks its token rows up in the real embedding table, kept here, with ggml's own
// to_float (what llama.cpp's get_rows runs), straight into the batch's embedding input;
// later stages take hidden states there.

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
import type { BatchStep, ForwardResult, HiddenRows, RowsForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from '../types.ts';
import { LLAMACPP_RANGE_ARCHITECTURES } from './architectures.ts';
import { LlamaModelFfi, defaultLlamaThreads, llamaBindings } from './ffi.ts';
import type { Bindings, KvType } from './ffi.ts';
import { LlamaRangePool } from './range-pool.ts';
import type { PoolRow, RowWriter } from './range-pool.ts';
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

/** most sessions one pool holds (what a stage's compute queue batches at most: peer/stage-forward.ts BATCH_STEPS) */
export const POOL_SLOTS = 32;

/** One session: a sequence of a pool, and how far it is. */
interface PoolSession {
  pool: LlamaRangePool;
  slot: number;
  /** next position (= tokens in the sequence's KV cells) */
  position: number;
  contextLength: number;
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
  private readonly sessions = new Map<string, PoolSession>();
  private readonly pools = new Set<LlamaRangePool>();
  /** buffer bytes llama.cpp allocated for a pool besides its KV cache (compute, output), by `${slots}:${cells}`, learnt from the pools made */
  private readonly overheads = new Map<string, number>();

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

  /** CPU threads each pool's llama_decode runs on (the option, else llama.cpp's default here) */
  get threads(): number {
    return this.options.threads ?? defaultLlamaThreads();
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

  /** bytes held for the sessions: every pool's KV cells (its free sequences' too), and the compute and output buffers llama.cpp reported */
  get sessionBytes(): number {
    let sum = 0;
    for (const p of this.pools) sum += p.slots * this.kvBytes(p.cells) + (p.buffers.compute ?? 0) + (p.buffers.output ?? 0);
    return sum;
  }

  /** the pools' sizes (sequences, of them in use, cells each) and what llama.cpp logged for each */
  get poolStats(): Array<{ slots: number; used: number; cells: number; buffers: Record<string, number> }> {
    return [...this.pools].map((p) => ({ slots: p.slots, used: p.used, cells: p.cells, buffers: { ...p.buffers } }));
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    if (!Number.isSafeInteger(options.contextLength) || options.contextLength <= 0) {
      throw new MeshError('BAD_CONTEXT_LENGTH', `context length must be a positive integer, got ${options.contextLength}`);
    }
    const cells = Math.ceil(options.contextLength / 256) * 256;
    const free = [...this.pools].find((p) => p.cells === cells && p.used < p.slots);
    const pool = free ?? this.grownPool(cells) ?? this.newPool(sessionId, cells, options.contextLength);
    this.sessions.set(sessionId, { pool, slot: pool.take(), position: 0, contextLength: options.contextLength });
  }

  async releaseSession(sessionId: string): Promise<void> {
    const s = this.session(sessionId);
    s.pool.give(s.slot);
    this.sessions.delete(sessionId);
    if (s.pool.used === 0) this.dropPool(s.pool);
    // a quarter used or less: remade with half its sequences, what a burst grew given back (a half-used pool neither grows nor shrinks)
    else if (s.pool.used * 4 <= s.pool.slots) this.remade(s.pool, Math.max(1, Math.floor(s.pool.slots / 2)));
  }

  /** bytes the budget holds now (weights as the planner counted them: the shard's tensor bytes) */
  private held(): number {
    return this.live().tensorBytes + this.sessionBytes;
  }

  /** The fullest pool of `cells` remade with twice its sequences (up to POOL_SLOTS); null when none is or it cannot be (remade). */
  private grownPool(cells: number): LlamaRangePool | null {
    const old = [...this.pools].filter((p) => p.cells === cells && p.slots < POOL_SLOTS).sort((x, y) => y.slots - x.slots)[0];
    return old ? this.remade(old, Math.min(POOL_SLOTS, old.slots * 2)) : null;
  }

  /**
   * `old` remade with `slots` sequences, its sessions' cells copied into the lowest of them in
   * order (a grown full pool keeps every session's sequence; a shrunk one closes its holes), when
   * the budget holds both side by side while they move (as llama.cpp allocated the new one);
   * null otherwise, the old pool and its sessions as they were.
   */
  private remade(old: LlamaRangePool, slots: number): LlamaRangePool | null {
    const budget = this.options.memoryBytes ?? Infinity;
    if (this.held() + slots * this.kvBytes(old.cells) + this.overhead(slots, old.cells) > budget) return null;
    const pool = this.makePool(old.cells, slots);
    const moving = [...this.sessions.values()].filter((s) => s.pool === old).sort((x, y) => x.slot - y.slot);
    try {
      if (this.held() > budget) throw new MeshError('STAGE_MEMORY_FULL', `a pool of ${slots} sequences does not fit beside the one it replaces`);
      moving.forEach((s, to) => pool.adopt(old, s.slot, to));
    } catch {
      this.dropPool(pool);
      return null;
    }
    for (const [to, s] of moving.entries()) {
      s.pool = pool;
      s.slot = to;
    }
    this.dropPool(old);
    return pool;
  }

  /** A pool of one sequence for the session, within the budget (STAGE_MEMORY_FULL beyond). */
  private newPool(sessionId: string, cells: number, contextLength: number): LlamaRangePool {
    const budget = this.options.memoryBytes ?? Infinity;
    const needs = this.kvBytes(cells) + this.overhead(1, cells);
    const held = this.held();
    if (held + needs > budget) {
      throw new MeshError(
        'STAGE_MEMORY_FULL',
        `session ${sessionId} needs about ${needs} bytes (KV for ${contextLength} positions); this stage holds ${held} of its ${budget}-byte budget (${this.sessions.size} sessions open)`,
        { needs, held, budget, sessions: this.sessions.size },
      );
    }
    return this.makePool(cells, 1);
  }

  private makePool(cells: number, slots: number): LlamaRangePool {
    const l = this.live();
    const pool = new LlamaRangePool(this.b!, l.model, { ...this.options, cells, slots, nEmbd: l.config.nEmbd, nBlocks: l.shard.end - l.shard.start, hasHead: l.hasHead });
    this.overheads.set(`${slots}:${cells}`, (pool.buffers.compute ?? 0) + (pool.buffers.output ?? 0));
    this.pools.add(pool);
    return pool;
  }

  /** what a pool of `slots` × `cells` will allocate besides its KV cells: as one of that size did, else the most one of as many sequences did (0 before any) */
  private overhead(slots: number, cells: number): number {
    const known = this.overheads.get(`${slots}:${cells}`);
    if (known !== undefined) return known;
    return Math.max(0, ...[...this.overheads].filter(([k]) => k.startsWith(`${slots}:`)).map(([, v]) => v));
  }

  private dropPool(pool: LlamaRangePool): void {
    pool.dispose();
    this.pools.delete(pool);
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const { output, computeMs } = await this.forwardRows(sessionId, input, position, 'f32');
    if (output.kind === 'logits') return { output, computeMs };
    return { output: { kind: 'hidden', hidden: new Float32Array(output.bytes.buffer, output.bytes.byteOffset, output.bytes.byteLength / 4), nTokens: output.nTokens }, computeMs };
  }

  async forwardRows(sessionId: string, input: StageInput | HiddenRows, position: number, outDtype: 'f16' | 'f32'): Promise<RowsForwardResult> {
    const l = this.live();
    const s = this.atPosition(sessionId, position);
    const started = performance.now();
    const { nTokens, write } = this.rowWriter(l, input);
    this.checkRoom(s, nTokens);
    const out = this.outRows(l, nTokens, outDtype);
    const logits = s.pool.decode(s.slot, position, nTokens, write, out);
    s.position += nTokens;
    return { output: out ?? { kind: 'logits', logits: logits! }, computeMs: performance.now() - started };
  }

  /**
   * One-token steps of distinct sessions, one llama_decode per pool they belong to (one for
   * sessions of one pool). Every step is checked before any computes; a failure part-way
   * drops every step from its session's KV cells, so each is where it was. Results are
   * llama.cpp's batched ones: on quantised weights the same bits as each step alone (measured),
   * on F32 weights not (ggml's F32 matmuls sum a batch of rows in another order than one row),
   * within the bounds test/llamacpp-batch.test.ts measures. computeMs: the whole batch's.
   */
  async forwardBatch(steps: readonly BatchStep[]): Promise<RowsForwardResult[]> {
    const l = this.live();
    if (new Set(steps.map((s) => s.sessionId)).size !== steps.length) throw new MeshError('BAD_STAGE_INPUT', 'a batch holds one step per session');
    const sessions = steps.map((st) => this.atPosition(st.sessionId, st.position));
    const rows = steps.map((st, i): PoolRow & { out: HiddenRows | null } => {
      const { nTokens, write } = this.rowWriter(l, st.input);
      if (nTokens !== 1) throw new MeshError('BAD_STAGE_INPUT', `a batched step is one token, session ${st.sessionId} sent ${nTokens}`);
      this.checkRoom(sessions[i]!, 1);
      return { slot: sessions[i]!.slot, position: st.position, write, out: this.outRows(l, 1, st.outDtype) };
    });
    const started = performance.now();
    const logits: Float32Array[] = new Array(steps.length);
    const done: number[] = [];
    try {
      for (const pool of new Set(sessions.map((s) => s.pool))) {
        const mine = sessions.flatMap((s, i) => (s.pool === pool ? [i] : []));
        pool.decodeRows(mine.map((i) => rows[i]!), (slot) => this.positionIn(pool, slot)).forEach((lg, j) => (logits[mine[j]!] = lg));
        done.push(...mine);
      }
    } catch (e) {
      for (const i of done) sessions[i]!.pool.rollback(sessions[i]!.slot, steps[i]!.position);
      throw e;
    }
    for (const s of sessions) s.position += 1;
    const computeMs = performance.now() - started;
    return rows.map((r, i) => ({ output: r.out ?? { kind: 'logits', logits: logits[i]! }, computeMs }));
  }

  /** the next position of the session in `pool`'s sequence `slot` (0 when none is; null when it is full) */
  private positionIn(pool: LlamaRangePool, slot: number): number | null {
    for (const s of this.sessions.values()) if (s.pool === pool && s.slot === slot) return s.position < s.contextLength ? s.position : null;
    return 0;
  }

  /** where a stage without the head puts `nTokens` hidden rows (null on the last stage) */
  private outRows(l: Loaded, nTokens: number, dtype: 'f16' | 'f32'): HiddenRows | null {
    const nEmbd = l.config.nEmbd;
    return l.hasHead ? null : { kind: 'rows', dtype, bytes: new Uint8Array(nTokens * nEmbd * (dtype === 'f16' ? 2 : 4)), nTokens, width: nEmbd };
  }

  private checkRoom(s: PoolSession, nTokens: number): void {
    if (s.position + nTokens > s.contextLength) {
      throw new MeshError('CONTEXT_FULL', `llama.cpp context is full: ${s.position} + ${nTokens} > ${s.contextLength}`);
    }
  }

  /** How the input's rows reach the batch: embedding lookups on stage 0, hidden rows after it (f32 hidden states as f32 rows). */
  private rowWriter(l: Loaded, given: StageInput | HiddenRows): { nTokens: number; write: RowWriter } {
    const input: StageInput | HiddenRows =
      given.kind === 'hidden'
        ? { kind: 'rows', dtype: 'f32', bytes: new Uint8Array(given.hidden.buffer, given.hidden.byteOffset, given.hidden.byteLength), nTokens: given.nTokens, width: given.hidden.length / Math.max(1, given.nTokens) }
        : given;
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
    const s = this.session(sessionId);
    const l = this.live();
    return { position: s.position, kvBytes: this.kvBytes(s.pool.cells), processedTokens: new Array<number>(l.shard.end - l.shard.start).fill(s.position) };
  }

  /** Graph nodes llama.cpp offered the eval callback in the last step of the session's pool (0 on the last stage, which captures nothing). */
  nodesOffered(sessionId: string): number {
    return this.session(sessionId).pool.nodesOffered;
  }

  /** Forgets a session's positions from `position` on (its KV cache keeps [0, position)). */
  rollbackSession(sessionId: string, position: number): void {
    const s = this.session(sessionId);
    s.pool.rollback(s.slot, position);
    s.position = Math.min(s.position, position);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    checkTruncate(sessionId, position, this.session(sessionId).position);
    this.rollbackSession(sessionId, position);
  }

  async dispose(): Promise<void> {
    for (const p of this.pools) p.dispose();
    this.pools.clear();
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

  private session(sessionId: string): PoolSession {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return s;
  }

  /** the session, which must be at `position` (never a silent recompute) */
  private atPosition(sessionId: string, position: number): PoolSession {
    const s = this.session(sessionId);
    if (position !== s.position) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${s.position}, forward was asked for position ${position}`, { expected: s.position, got: position });
    }
    return s;
  }
}
