// The activation buffers a forward pass works in, shared by every session of a stage (calls run
// one at a time): scratch sized for the largest batch seen so far, the split-K attention
// partials sized for the longest context seen so far, and for batched decode steps the rope
// tables and logits of their rows.

import type { GpuMemory } from './gpu-memory.ts';
import * as op from './ops.ts';
import type { ShardWeights } from './shard-weights.ts';
import type { StageKernels } from './stage-kernels.ts';
import { BufferUsage } from './usage.ts';

const ACTIVATION = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST;

/** Activation buffers for up to `tokens` tokens per forward call. */
export interface Scratch {
  tokens: number;
  x: GPUBuffer; // [n × nEmbd] residual stream
  xb: GPUBuffer; // [n × nEmbd] normed block input
  q: GPUBuffer; // [n × nHead·headDim]
  att: GPUBuffer; // [n × nHead·headDim] attention output (and raw q when q is normed)
  qGate?: GPUBuffer; // [n × nHead·2·headDim] a gated attention's q projection (per head the query, then its gate)
  kTmp?: GPUBuffer; // [n × nHeadKv·headDim] f32 k on its way to the cache (normed, f16 or split caches)
  kTmp2?: GPUBuffer; // [n × nHeadKv·headDim] f32 normed k for an f16 or split cache (qwen3, gemma3)
  vTmp?: GPUBuffer; // [n × nHeadKv·headDim] f32 v for an f16 or split cache
  tmp: GPUBuffer; // [n × nEmbd] block output before the residual add
  gate: GPUBuffer; // [n × nFf]
  up: GPUBuffer; // [n × nFf]
  ids: GPUBuffer; // [n] u32 token ids
  rope: GPUBuffer; // [n × nRot/2] (cos, sin)
  ropeSwa?: GPUBuffer; // [n × nRot/2] the sliding-window layers' table (gemma3)
  logits?: GPUBuffer; // [nVocab]
  /** rounded copies of a matmul input, by format: [n × widest input row] (ggml rounding only) */
  rounded: Partial<Record<Exclude<op.ActivationFormat, 'f32'>, GPUBuffer>>;
}

export class ForwardBuffers {
  private scratch: Scratch | null = null;
  private partial: GPUBuffer | null = null; // split-K attention partials, grown to the longest context
  private partialElements = 0;
  /** a batch's rope tables (one per distinct row of configs) and its rows' logits, grown to the largest batch */
  private rowTables: GPUBuffer[] = [];
  private rowTablesRows = 0;
  private rowLogits: GPUBuffer | null = null;
  private rowLogitsRows = 0;

  constructor(
    private readonly memory: GpuMemory,
    private readonly weights: ShardWeights,
    private readonly kernels: StageKernels,
  ) {}

  /** scratch for a forward of n tokens, made anew when the current one is too small */
  scratchFor(n: number): Scratch {
    if (this.scratch && this.scratch.tokens >= n) return this.scratch;
    this.freeScratch();
    const m = this.weights;
    const c = m.config;
    const tokens = n;
    const qDim = c.nHead * c.headDim;
    const kvDim = c.nHeadKv * c.headDim;
    const kNorm = m.layers.some((l) => 'kNorm' in l && l.kNorm);
    const vDim = c.linearAttention ? c.linearAttention.nVHeads * c.linearAttention.headDim : 0;
    // the dense FFN's width, or the shared expert's (a MoE without one needs none)
    const ffnWidth = Math.max(1, c.moe ? c.moe.nFfShared : c.nFf);
    const buf = (label: string, elements: number) => this.memory.create(label, elements * 4, ACTIVATION);
    this.scratch = {
      tokens,
      x: buf('x', tokens * c.nEmbd),
      xb: buf('xb', tokens * c.nEmbd),
      q: buf('q', tokens * qDim),
      att: buf('att', tokens * qDim),
      qGate: c.attnOutputGate ? buf('q gate', tokens * 2 * qDim) : undefined,
      // (k and v stage here for normed or f16 caches, and for caches split by heads, which any session may have)
      kTmp: buf('kTmp', tokens * kvDim),
      kTmp2: kNorm ? buf('kTmp2', tokens * kvDim) : undefined,
      vTmp: buf('vTmp', tokens * kvDim),
      tmp: buf('tmp', tokens * c.nEmbd),
      gate: buf('gate', tokens * ffnWidth),
      up: buf('up', tokens * ffnWidth),
      ids: buf('ids', tokens),
      rope: buf('rope', tokens * c.rope.nRot),
      ropeSwa: c.ropeSwa ? buf('rope swa', tokens * c.rope.nRot) : undefined,
      logits: m.output ? buf('logits', m.output.rows) : undefined,
      rounded: {},
    };
    if (this.kernels.roundActivations) {
      const widest = tokens * Math.max(c.nEmbd, qDim, ffnWidth, vDim);
      for (const f of ['f16', 'bf16', 'q8_0', 'q8_K'] as const) this.scratch.rounded[f] = buf(`x rounded ${f}`, widest);
    }
    return this.scratch;
  }

  /** the split-K partial buffer for attention over nKv positions, grown by at least doubling */
  partialFor(nKv: number): GPUBuffer {
    const c = this.weights.config;
    const need = op.attentionPartialElements({ nHead: c.nHead, nHeadKv: c.nHeadKv, headDim: c.headDim }, nKv);
    if (!this.partial || this.partialElements < need) {
      this.memory.destroy(this.partial);
      this.partialElements = Math.max(need, this.partialElements * 2);
      this.partial = this.memory.create('attention partials', this.partialElements * 4, ACTIVATION);
    }
    return this.partial;
  }

  /** `count` rope tables of `rows` rows each, for a batch of sessions' steps */
  tablesFor(count: number, rows: number): GPUBuffer[] {
    if (this.rowTablesRows < rows) {
      for (const b of this.rowTables) this.memory.destroy(b);
      this.rowTables = [];
      this.rowTablesRows = rows;
    }
    while (this.rowTables.length < count) this.rowTables.push(this.memory.create(`rope rows ${this.rowTables.length}`, rows * this.weights.config.rope.nRot * 4, ACTIVATION));
    return this.rowTables.slice(0, count);
  }

  /** [rows × nVocab] logits of a batch (the shard holds the head) */
  logitsFor(rows: number): GPUBuffer {
    if (!this.rowLogits || this.rowLogitsRows < rows) {
      this.memory.destroy(this.rowLogits);
      this.rowLogitsRows = rows;
      this.rowLogits = this.memory.create('logits rows', rows * this.weights.output!.rows * 4, ACTIVATION);
    }
    return this.rowLogits;
  }

  dispose(): void {
    for (const b of this.rowTables) this.memory.destroy(b);
    this.rowTables = [];
    this.memory.destroy(this.rowLogits);
    this.rowLogits = null;
    this.freeScratch();
    this.memory.destroy(this.partial);
    this.partial = null;
  }

  private freeScratch(): void {
    const sc = this.scratch;
    if (!sc) return;
    for (const b of [sc.x, sc.xb, sc.q, sc.att, sc.qGate, sc.kTmp, sc.kTmp2, sc.vTmp, sc.tmp, sc.gate, sc.up, sc.ids, sc.rope, sc.ropeSwa, sc.logits, ...Object.values(sc.rounded)]) this.memory.destroy(b);
    this.scratch = null;
  }
}
