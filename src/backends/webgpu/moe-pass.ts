// The mixture-of-experts feed-forward of one layer on the GPU, recorded into a forward's
// submission: router logits → moe_route (softmax, top-k, weights) → the experts' gate and up
// (gather-by-expert mat-vec for one token on GPUs; otherwise slots grouped by expert and the
// grouped matmul) → SwiGLU/GeGLU → down → the weighted sum (plus qwen2moe's gated shared
// expert). Only the routed experts' weights are read. Its scratch (per batch size) is its own.

import { activationFormatFor } from '../cpu/act-round.ts';
import type { ModelConfig, MoeConfig } from '../../model/config.ts';
import type { GpuExperts } from './experts.ts';
import type { GpuMemory } from './gpu-memory.ts';
import type { Recorder } from './kernels.ts';
import type { DenseFfnWeights, MoeFfnWeights } from './layer-weights.ts';
import type { GpuMatrix } from './matrix.ts';
import * as moeOp from './moe-ops.ts';
import * as op from './ops.ts';
import type { StageKernels } from './stage-kernels.ts';
import { BufferUsage } from './usage.ts';

const ACTIVATION = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST;

/** Activation buffers of the MoE block for up to `tokens` tokens. */
interface MoeScratch {
  tokens: number;
  logits: GPUBuffer; // [n × nExpert] router logits
  ids: GPUBuffer; // [n × k] u32 chosen experts
  weights: GPUBuffer; // [n × k] f32 their weights
  offsets: GPUBuffer; // [nExpert + 1] u32 slot ranges by expert
  slots: GPUBuffer; // [n × k] u32 slots grouped by expert
  gate: GPUBuffer; // [n × k × nFfExp]
  up: GPUBuffer; // [n × k × nFfExp]
  down: GPUBuffer; // [n × k × nEmbd]
  shGate?: GPUBuffer; // [n] shared expert gate logit (qwen2moe)
  shOut?: GPUBuffer; // [n × nEmbd] shared expert output
  /** ggml-rounded copies of an expert matmul input, by format: [n × k × max(nEmbd, nFfExp)] */
  rounded: Map<string, GPUBuffer>;
}

/** What the MoE block needs from the dense path: the matmul with ggml rounding, and the gated FFN. */
export interface DensePath {
  matmul(w: GpuMatrix, x: GPUBuffer, out: GPUBuffer, outStride: number, n: number): void;
  ffn(w: DenseFfnWeights, x: GPUBuffer, out: GPUBuffer, n: number): void;
  activation(gate: GPUBuffer, up: GPUBuffer, n: number): void;
}

export class MoePass {
  private scratch: MoeScratch | null = null;

  constructor(
    private readonly memory: GpuMemory,
    private readonly config: ModelConfig,
    private readonly kernels: StageKernels,
  ) {}

  /** out [n × nEmbd] = the MoE block over x [n × nEmbd] (the normed residual). */
  record(rec: Recorder, w: MoeFfnWeights, x: GPUBuffer, out: GPUBuffer, n: number, dense: DensePath): void {
    const moe = this.config.moe!;
    const { nEmbd } = this.config;
    const k = moe.nExpertUsed;
    const sc = this.scratchFor(n, moe);
    // router → experts and weights per token
    dense.matmul(w.router, x, sc.logits, moe.nExpert, n);
    moeOp.moeRoute(rec, sc.logits, sc.ids, sc.weights, n, moe.nExpert, k, moe.normWeights);
    // one token on a GPU: gather each chosen expert's rows; else group the slots by expert
    const gather = n === 1 && this.kernels.matVec === 'mul_mat_vec';
    if (!gather) moeOp.moeGroup(rec, sc.ids, sc.offsets, sc.slots, n * k, moe.nExpert);
    const expertMatmul = (e: GpuExperts, input: GPUBuffer, xDiv: number, rows: number, dst: GPUBuffer) => {
      const io = { x: this.rounded(rec, sc, e, input, rows), xStride: e.k, xDiv, out: dst, outStride: e.expertRows };
      if (gather) moeOp.matVecId(rec, e, io, sc.ids, n * k);
      else moeOp.matMulId(rec, e, io, sc.slots, sc.offsets, n * k);
    };
    expertMatmul(w.gate, x, k, n, sc.gate);
    expertMatmul(w.up, x, k, n, sc.up);
    dense.activation(sc.gate, sc.up, n * k * moe.nFfExp);
    expertMatmul(w.down, sc.gate, 1, n * k, sc.down);
    // weighted sum, plus the shared expert times its gate
    if (w.shared) {
      dense.matmul(w.shared.gateInp, x, sc.shGate!, 1, n);
      dense.ffn(w.shared.ffn, x, sc.shOut!, n);
      moeOp.moeCombine(rec, sc.down, sc.weights, out, n, nEmbd, k, { out: sc.shOut!, gate: sc.shGate!, sigmoid: moe.sigmoidSharedGate });
    } else {
      moeOp.moeCombine(rec, sc.down, sc.weights, out, n, nEmbd, k);
    }
  }

  /** x itself, or its copy rounded as ggml rounds activations for the experts' weight type. */
  private rounded(rec: Recorder, sc: MoeScratch, e: GpuExperts, x: GPUBuffer, rows: number): GPUBuffer {
    if (!this.kernels.roundActivations) return x;
    const format = activationFormatFor(e.type);
    if (format === 'f32' || !op.roundsRows(format, e.k)) return x;
    // (a fresh copy per call: gate and up share x but are rounded separately when their types differ)
    const key = `${format}:${e.k}`;
    let buf = sc.rounded.get(key);
    if (!buf) {
      const moe = this.config.moe!;
      buf = this.memory.create(`moe x rounded ${key}`, sc.tokens * moe.nExpertUsed * Math.max(this.config.nEmbd, moe.nFfExp) * 4, ACTIVATION);
      sc.rounded.set(key, buf);
    }
    op.roundActivations(rec, format, x, buf, rows * e.k);
    return buf;
  }

  private scratchFor(n: number, moe: MoeConfig): MoeScratch {
    if (this.scratch && this.scratch.tokens >= n) return this.scratch;
    this.dispose();
    const { nEmbd } = this.config;
    const k = moe.nExpertUsed;
    const buf = (label: string, elements: number) => this.memory.create(`moe ${label}`, Math.max(1, elements) * 4, ACTIVATION);
    this.scratch = {
      tokens: n,
      logits: buf('logits', n * moe.nExpert),
      ids: buf('ids', n * k),
      weights: buf('weights', n * k),
      offsets: buf('offsets', moe.nExpert + 1),
      slots: buf('slots', n * k),
      gate: buf('gate', n * k * moe.nFfExp),
      up: buf('up', n * k * moe.nFfExp),
      down: buf('down', n * k * nEmbd),
      ...(moe.nFfShared > 0 ? { shGate: buf('shared gate', n), shOut: buf('shared out', n * nEmbd) } : {}),
      rounded: new Map(),
    };
    return this.scratch;
  }

  dispose(): void {
    const sc = this.scratch;
    if (!sc) return;
    for (const b of [sc.logits, sc.ids, sc.weights, sc.offsets, sc.slots, sc.gate, sc.up, sc.down, sc.shGate, sc.shOut, ...sc.rounded.values()]) this.memory.destroy(b);
    this.scratch = null;
  }
}
