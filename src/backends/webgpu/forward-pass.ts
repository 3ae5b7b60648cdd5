// The forward pass of one shard over n tokens at positions [pos, pos + n): every dispatch
// recorded on one Recorder and submitted once; only the stage's output is read back (hidden
// states [n × n_embd], or the last position's logits on the shard that holds the head).
// Formulas shared with the CPU reference (RoPE angles, ggml's activation rounding rule) are
// imported from it, so the two backends cannot drift apart.

import { MeshError } from '../../errors.ts';
import { activationFormatFor } from '../cpu/act-round.ts';
import { ropeFor } from '../../model/config.ts';
import type { RopeConfig } from '../../model/config.ts';
import type { StageInput, StageOutput } from '../types.ts';
import { DeltaNetPass } from './delta-net-pass.ts';
import type { MatmulAt } from './delta-net-pass.ts';
import { ForwardBuffers } from './forward-buffers.ts';
import type { Scratch } from './forward-buffers.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { isDeltaNet } from './hybrid-weights.ts';
import { Recorder } from './kernels.ts';
import type { KernelLibrary, SubmitResources } from './kernels.ts';
import type { DenseFfnWeights } from './layer-weights.ts';
import type { GpuMatrix } from './matrix.ts';
import { MoePass } from './moe-pass.ts';
import type { DensePath } from './moe-pass.ts';
import * as op from './ops.ts';
import { ropeTable } from './rope-table.ts';
import { recordQueries, recordRowsAttention } from './rows-attention.ts';
import type { RowsMatmul } from './rows-attention.ts';
import type { KvPart, SessionKv } from './session-kv.ts';
import type { BlockWeights, LayerWeights, ShardWeights } from './shard-weights.ts';
import type { StageKernels } from './stage-kernels.ts';

export class ForwardPass {
  private readonly buffers: ForwardBuffers;
  private readonly moe: MoePass | null;
  private readonly delta: DeltaNetPass | null;

  constructor(
    private readonly memory: GpuMemory,
    private readonly library: KernelLibrary,
    private readonly resources: SubmitResources,
    private readonly weights: ShardWeights,
    private readonly kernels: StageKernels,
  ) {
    this.buffers = new ForwardBuffers(memory, weights, kernels);
    this.moe = weights.config.moe ? new MoePass(memory, weights.config, kernels) : null;
    this.delta = weights.config.linearAttention ? new DeltaNetPass(memory, weights.config) : null;
  }

  /** Runs the shard over `input` (n tokens, already checked) at `position` of `kv`. */
  async run(kv: SessionKv, input: StageInput, n: number, position: number): Promise<StageOutput> {
    const m = this.weights;
    const c = m.config;
    const sc = this.buffers.scratchFor(n);
    const partial = this.buffers.partialFor(position + n);
    const queue = this.library.device.queue;
    this.writeInputs(sc, [input]);
    // the rope tables this session's layers use (sliding-window layers and long Phi-3 sessions have their own)
    const tables = new Map<RopeConfig, GPUBuffer>();
    const ropes = m.layers.map((_, l) => ropeFor(c, m.shard.start + l, kv.contextLength));
    for (const r of ropes) {
      if (tables.has(r)) continue;
      const buf = tables.size === 0 ? sc.rope : sc.ropeSwa!;
      queue.writeBuffer(buf, 0, ropeTable(r, position, n) as Float32Array<ArrayBuffer>);
      tables.set(r, buf);
    }

    const rec = new Recorder(this.library, this.resources);
    kv.grow(rec, position + n);
    kv.recurrent?.beginForward(rec, position, n);
    this.embed(rec, sc, n);
    m.layers.forEach((layer, l) => {
      const il = m.shard.start + l;
      // the block kind: a Gated DeltaNet over the session's recurrent state, or attention over its KV cache
      if (isDeltaNet(layer)) {
        const st = kv.recurrent!;
        this.delta!.record(rec, layer, st.layers[l]!, sc.x, sc.xb, sc.tmp, n, st.rows, this.matmulAt(rec, sc));
        this.addResidual(rec, sc, undefined, n);
      } else {
        this.recordAttention(rec, layer, kv.keys[l]!, kv.values[l]!, kv.parts, sc, partial, n, position, tables.get(ropes[l]!)!, c.swaLayers[il] ? c.slidingWindow : 0);
      }
      this.recordFfn(rec, layer, sc, n);
    });
    const out = await this.finish(rec, sc, n, 1, sc.logits!, this.kernels.matMul);
    return out.logits ? { kind: 'logits', logits: out.logits[0]! } : { kind: 'hidden', hidden: out.hidden!, nTokens: n };
  }

  /**
   * One-token steps of distinct sessions (already checked; every layer attends, no experts) as
   * one pass: B rows through the projections, the feed-forward and the head together, each
   * row's attention against its own session's cache (./rows-attention.ts). Each row's result is
   * the bits of that session's own `run`: the matmuls take the decode kernel for every row.
   * The caches may grow: the caller saves them first and commits or restores them after.
   */
  async runBatch(steps: readonly { kv: SessionKv; input: StageInput; position: number }[]): Promise<StageOutput[]> {
    const m = this.weights;
    const c = m.config;
    const B = steps.length;
    const sc = this.buffers.scratchFor(B);
    const partial = this.buffers.partialFor(Math.max(...steps.map((s) => s.position)) + 1);
    this.writeInputs(sc, steps.map((s) => s.input));
    const tables = this.rowTables(steps);
    const rec = new Recorder(this.library, this.resources);
    for (const s of steps) s.kv.grow(rec, s.position + 1);
    this.embed(rec, sc, B);
    const mm: RowsMatmul = (w, x, memo, out, outOffset, outStride) => op.matmul(rec, w, this.input(rec, sc, w, x, B, memo), 0, out, outOffset, outStride, B, this.kernels.matVec, 'decode');
    m.layers.forEach((layer, l) => {
      if (isDeltaNet(layer)) throw new MeshError('BATCH_UNSUPPORTED', 'internal: a batch reached a Gated DeltaNet layer');
      const il = m.shard.start + l;
      const rows = steps.map((s) => ({ keys: s.kv.keys[l]!, values: s.kv.values[l]!, parts: s.kv.parts, position: s.position }));
      recordRowsAttention(rec, c, this.kernels.kvType, layer, rows, sc, partial, tables[l]!, c.swaLayers[il] ? c.slidingWindow : 0, mm);
      this.addResidual(rec, sc, layer.attnPostNorm, B);
      this.recordFfn(rec, layer, sc, B, 'decode');
    });
    const out = await this.finish(rec, sc, B, B, m.output ? this.buffers.logitsFor(B) : sc.x, 'decode');
    if (out.logits) return out.logits.map((logits) => ({ kind: 'logits', logits }));
    return steps.map((_, i) => ({ kind: 'hidden', hidden: out.hidden!.slice(i * c.nEmbd, (i + 1) * c.nEmbd), nTokens: 1 }));
  }

  dispose(): void {
    this.buffers.dispose();
    this.moe?.dispose();
    this.delta?.dispose();
  }

  /** token ids, or hidden rows, of the inputs one after another */
  private writeInputs(sc: Scratch, inputs: readonly StageInput[]): void {
    const queue = this.library.device.queue;
    if (inputs[0]!.kind === 'tokens') {
      const ids = inputs.flatMap((i) => (i.kind === 'tokens' ? [...i.tokens] : []));
      queue.writeBuffer(sc.ids, 0, new Uint32Array(ids));
      return;
    }
    let at = 0;
    for (const i of inputs) {
      if (i.kind !== 'hidden') continue;
      queue.writeBuffer(sc.x, at, i.hidden as Float32Array<ArrayBuffer>);
      at += i.hidden.byteLength;
    }
  }

  /** the first stage: the rows' token embeddings into the residual stream */
  private embed(rec: Recorder, sc: Scratch, n: number): void {
    const m = this.weights;
    if (!m.tokenEmbd) return;
    op.getRows(rec, m.tokenEmbd, sc.ids, sc.x, n);
    if (m.config.embedScale !== 1) op.scale(rec, sc.x, 0, n * m.config.nEmbd, m.config.embedScale);
  }

  /**
   * Submits the pass and reads back its output: on the shard with the head, the logits of the
   * last `headRows` of the n rows (output norm, then the head, into `logitsBuf`); otherwise the
   * hidden states [n × n_embd].
   */
  private async finish(rec: Recorder, sc: Scratch, n: number, headRows: number, logitsBuf: GPUBuffer, rowsKernel: op.RowsKernel): Promise<{ logits?: Float32Array[]; hidden?: Float32Array }> {
    const m = this.weights;
    const c = m.config;
    if (!m.output || !m.outputNorm) return { hidden: new Float32Array((await rec.submit({ buffer: sc.x, offset: 0, bytes: n * c.nEmbd * 4 }))!) };
    const vocab = m.output.rows;
    op.rmsNorm(rec, sc.x, (n - headRows) * c.nEmbd, c.nEmbd, m.outputNorm, sc.xb, 0, c.nEmbd, c.nEmbd, headRows, c.rmsEps);
    op.matmul(rec, m.output, this.input(rec, sc, m.output, sc.xb, headRows, new Map()), 0, logitsBuf, 0, vocab, headRows, this.kernels.matVec, rowsKernel);
    const all = new Float32Array((await rec.submit({ buffer: logitsBuf, offset: 0, bytes: headRows * vocab * 4 }))!);
    // gemma: logits = c · tanh(logits / c), on the host as the CPU reference does it
    const cap = c.finalLogitSoftcap;
    if (cap > 0) for (let i = 0; i < all.length; i++) all[i] = Math.fround(Math.fround(Math.tanh(Math.fround(all[i]! * Math.fround(1 / cap)))) * cap);
    return { logits: Array.from({ length: headRows }, (_, r) => (headRows === 1 ? all : all.slice(r * vocab, (r + 1) * vocab))) };
  }

  /** per layer, the rope table of a batch: row i session i's angles at its position (one table per distinct row of configs) */
  private rowTables(steps: readonly { kv: SessionKv; position: number }[]): GPUBuffer[] {
    const m = this.weights;
    const ids = new Map<RopeConfig, number>();
    const keyOf = (ropes: RopeConfig[]) => ropes.map((r) => ids.get(r) ?? ids.set(r, ids.size).get(r)!).join(',');
    const perLayer = m.layers.map((_, l) => steps.map((s) => ropeFor(m.config, m.shard.start + l, s.kv.contextLength)));
    const keys = perLayer.map(keyOf);
    const distinct = [...new Set(keys)];
    const buffers = this.buffers.tablesFor(distinct.length, steps.length);
    distinct.forEach((key, t) => {
      const ropes = perLayer[keys.indexOf(key)]!;
      const rows = ropes.map((r, i) => ropeTable(r, steps[i]!.position, 1));
      const table = new Float32Array(rows.reduce((a, r) => a + r.length, 0));
      let at = 0;
      for (const r of rows) {
        table.set(r, at);
        at += r.length;
      }
      this.library.device.queue.writeBuffer(buffers[t]!, 0, table);
    });
    return keys.map((k) => buffers[distinct.indexOf(k)]!);
  }

  /** One block's attention over n tokens at positions [pos, pos + n), with its residual add. */
  private recordAttention(
    rec: Recorder,
    w: LayerWeights,
    kParts: GPUBuffer[],
    vParts: GPUBuffer[],
    parts: readonly KvPart[],
    sc: Scratch,
    partial: GPUBuffer,
    n: number,
    pos: number,
    ropeTab: GPUBuffer,
    window: number,
  ): void {
    const c = this.weights.config;
    const { nEmbd, nHead, nHeadKv, headDim, rmsEps } = c;
    const kvDim = nHeadKv * headDim;
    const kvAt = pos * kvDim; // this batch's rows of the cache
    const { matVec, matMul, kvType } = this.kernels;
    const neox = c.rope.mode === 'neox';
    const mm: RowsMatmul = (w, x, memo, out, outOffset, outStride) =>
      op.matmul(rec, w, this.input(rec, sc, w, x, n, memo), 0, out, outOffset, outStride, n, matVec, matMul);

    // attention norm
    op.rmsNorm(rec, sc.x, 0, nEmbd, w.attnNorm, sc.xb, 0, nEmbd, nEmbd, n, rmsEps);
    // q, k, v projections (+ biases for qwen2, per-head norms for qwen3), RoPE; k and v are
    // computed in f32 and land straight in an f32 cache, or are packed into an f16 one
    const f16kv = kvType === 'f16';
    // a cache split by heads: k and v are computed in f32 scratch, then stored part by part
    const split = parts.length > 1;
    const kCache = kParts[0]!;
    const vCache = vParts[0]!;
    const storeParts = (src: GPUBuffer, dst: GPUBuffer[]) => parts.forEach((part, i) => op.kvStore(rec, src, dst[i]!, part, headDim, kvDim, n, pos, kvType));
    const normed = new Map<string, GPUBuffer>();
    const { qRaw, qStride } = recordQueries(rec, c, w, sc, n, ropeTab, normed, mm);

    const direct = !w.kNorm && !f16kv && !split; // k computed in place in the cache
    let kBuf = direct ? kCache : sc.kTmp!;
    let kAt = direct ? kvAt : 0;
    mm(w.wk, sc.xb, normed, kBuf, kAt, kvDim);
    if (w.bk) op.add(rec, kBuf, kAt, w.bk, n * kvDim, kvDim);
    if (w.kNorm) {
      const staged = f16kv || split;
      const dst = staged ? sc.kTmp2! : kCache;
      const dstAt = staged ? 0 : kvAt;
      op.rmsNorm(rec, kBuf, kAt, headDim, w.kNorm, dst, dstAt, headDim, headDim, n * nHeadKv, rmsEps);
      kBuf = dst;
      kAt = dstAt;
    }
    op.rope(rec, kBuf, kAt, ropeTab, n, nHeadKv, headDim, c.rope.nRot, neox);
    if (split) storeParts(kBuf, kParts);
    else if (f16kv) op.packF16(rec, kBuf, kCache, n * kvDim, 0, kvAt);

    const vBuf = f16kv || split ? sc.vTmp! : vCache;
    const vAt = f16kv || split ? 0 : kvAt;
    mm(w.wv, sc.xb, normed, vBuf, vAt, kvDim);
    if (w.bv) op.add(rec, vBuf, vAt, w.bv, n * kvDim, kvDim);
    if (split) storeParts(vBuf, vParts);
    else if (f16kv) op.packF16(rec, vBuf, vCache, n * kvDim, 0, kvAt);
    // attention over the cache (the last `window` positions in a sliding-window layer): split-K
    // for one token, tiled causal for a batch
    const shape = { nHead, nHeadKv, headDim };
    const scoreScale = c.queryScale !== null ? 1 : 1 / Math.sqrt(headDim);
    const slices = parts.map((part, i) => ({ k: kParts[i]!, v: vParts[i]!, slice: split ? part : { h0: 0, heads: nHeadKv } }));
    if (n === 1) op.attentionDecode(rec, shape, sc.q, 0, kCache, vCache, partial, sc.att, pos + 1, kvType, window, scoreScale, slices);
    else for (const p of slices) op.attentionPrefill(rec, shape, sc.q, p.k, p.v, sc.att, n, pos, kvType, window, scoreScale, p.slice);
    if (w.outputGate) op.sigmoidGate(rec, sc.att, qRaw, n * nHead, headDim, headDim, qStride);
    // output projection (and its post-norm, gemma3), residual
    mm(w.wo, sc.att, new Map(), sc.tmp, 0, nEmbd);
    this.addResidual(rec, sc, w.attnPostNorm, n);
  }

  /** One block's feed-forward: norm, dense gated FFN or mixture of experts, residual add. */
  private recordFfn(rec: Recorder, w: BlockWeights, sc: Scratch, n: number, rowsKernel: op.RowsKernel = this.kernels.matMul): void {
    const c = this.weights.config;
    op.rmsNorm(rec, sc.x, 0, c.nEmbd, w.ffnNorm, sc.xb, 0, c.nEmbd, c.nEmbd, n, c.rmsEps);
    if (w.ffn.kind === 'moe') this.moe!.record(rec, w.ffn, sc.xb, sc.tmp, n, this.densePath(rec, sc));
    else this.densePath(rec, sc, rowsKernel).ffn(w.ffn, sc.xb, sc.tmp, n);
    this.addResidual(rec, sc, 'ffnPostNorm' in w ? w.ffnPostNorm : undefined, n);
  }

  /** x += block output (sc.tmp), RMS-normed first when the block has a post-norm (normed into sc.xb, which is free by then). */
  private addResidual(rec: Recorder, sc: Scratch, postNorm: GPUBuffer | undefined, n: number): void {
    const { nEmbd, rmsEps } = this.weights.config;
    let out = sc.tmp;
    if (postNorm) {
      op.rmsNorm(rec, sc.tmp, 0, nEmbd, postNorm, sc.xb, 0, nEmbd, nEmbd, n, rmsEps);
      out = sc.xb;
    }
    op.add(rec, sc.x, 0, out, n * nEmbd);
  }

  /** A matmul with ggml's activation rounding, writing at an offset and stride of `out`. */
  private matmulAt(rec: Recorder, sc: Scratch): MatmulAt {
    const { matVec, matMul } = this.kernels;
    return (w, x, n, memo, out, outOffset, outStride) => op.matmul(rec, w, this.input(rec, sc, w, x, n, memo), 0, out, outOffset, outStride, n, matVec, matMul);
  }

  /** The dense building blocks, with ggml's activation rounding: a matmul (several rows through `rowsKernel`), the gated FFN, its activation. */
  private densePath(rec: Recorder, sc: Scratch, rowsKernel: op.RowsKernel = this.kernels.matMul): DensePath {
    const c = this.weights.config;
    const { matVec } = this.kernels;
    const activation = (gate: GPUBuffer, up: GPUBuffer, count: number) => {
      if (c.ffnActivation === 'gelu') op.geglu(rec, gate, up, this.weights.geluTable!, count);
      else op.swiglu(rec, gate, up, count);
    };
    const matmul = (w: GpuMatrix, x: GPUBuffer, out: GPUBuffer, outStride: number, n: number, memo = new Map<string, GPUBuffer>()) =>
      op.matmul(rec, w, this.input(rec, sc, w, x, n, memo), 0, out, 0, outStride, n, matVec, rowsKernel);
    return {
      matmul,
      activation,
      ffn: (w: DenseFfnWeights, x: GPUBuffer, out: GPUBuffer, n: number) => {
        // gate and up (one rounding of x), SwiGLU / GeGLU, down
        const ffnIn = new Map<string, GPUBuffer>();
        matmul(w.wGate, x, sc.gate, w.wGate.rows, n, ffnIn);
        matmul(w.wUp, x, sc.up, w.wUp.rows, n, ffnIn);
        activation(sc.gate, sc.up, n * w.wGate.rows);
        matmul(w.wDown, sc.gate, out, c.nEmbd, n);
      },
    };
  }

  /**
   * The buffer a matmul with `w` should read for input x ([n × w.k]): x itself, or a copy
   * rounded as ggml rounds activations for w's type — made once per format per input (memo).
   */
  private input(rec: Recorder, sc: Scratch, w: GpuMatrix, x: GPUBuffer, n: number, memo: Map<string, GPUBuffer>): GPUBuffer {
    if (!this.kernels.roundActivations) return x;
    const format = activationFormatFor(w.type);
    if (format === 'f32' || !op.roundsRows(format, w.k)) return x;
    let out = memo.get(format);
    if (!out) {
      out = sc.rounded[format]!;
      op.roundActivations(rec, format, x, out, n * w.k);
      memo.set(format, out);
    }
    return out;
  }
}
