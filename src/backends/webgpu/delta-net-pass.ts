// A Gated DeltaNet block's token mixer recorded into a forward's submission, as the CPU
// reference's hybrid-layer.ts computes it: attn_norm → the q|k|v mix, α and β projections
// (written side by side as the step kernel's per-token rows) and the output gate z →
// delta_net_gates (log-decay, sigmoid β) → per token the conv + delta rule over the session's
// state (delta-net.ts) → RMSNorm per head (ssm_norm) → ⊙ SiLU(z) → ssm_out. The caller adds
// the residual. Its scratch (per batch size) is its own.

import type { ModelConfig } from '../../model/config.ts';
import { deltaInputWidth, recordDeltaTokens } from './delta-net.ts';
import type { GpuDeltaState } from './delta-net.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { grid2d } from './kernels.ts';
import type { Recorder } from './kernels.ts';
import type { DeltaNetLayerWeights } from './hybrid-weights.ts';
import type { GpuMatrix } from './matrix.ts';
import * as op from './ops.ts';
import { BufferUsage } from './usage.ts';

const ACTIVATION = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST;

/** A matmul with ggml's activation rounding (one rounding of x per memo): out[t·outStride + outOffset + row]. */
export type MatmulAt = (w: GpuMatrix, x: GPUBuffer, n: number, memo: Map<string, GPUBuffer>, out: GPUBuffer, outOffset: number, outStride: number) => void;

interface DeltaScratch {
  tokens: number;
  inputs: GPUBuffer; // [n × (channels + 2·nV)] q|k|v mix, g, β
  z: GPUBuffer; // [n × nV·d] output gate, then the gated output
  o: GPUBuffer; // [n × nV·d] the delta rule's output
  normed: GPUBuffer; // [n × nV·d] o RMS-normed per head
}

export class DeltaNetPass {
  private scratch: DeltaScratch | null = null;

  constructor(
    private readonly memory: GpuMemory,
    private readonly config: ModelConfig,
  ) {}

  /** out [n × nEmbd] = the block's mixer over x [n × nEmbd] (the residual stream), xb its scratch; `rows`: tokens of the current chunk before these. */
  record(rec: Recorder, w: DeltaNetLayerWeights, state: GpuDeltaState, x: GPUBuffer, xb: GPUBuffer, out: GPUBuffer, n: number, rows: number, matmul: MatmulAt): void {
    const c = this.config;
    const la = c.linearAttention!;
    const { nVHeads: nV, headDim: d, convChannels: ch } = la;
    const width = deltaInputWidth(la);
    const sc = this.scratchFor(n);
    op.rmsNorm(rec, x, 0, c.nEmbd, w.attnNorm, xb, 0, c.nEmbd, c.nEmbd, n, c.rmsEps);
    const normed = new Map<string, GPUBuffer>();
    matmul(w.net.wqkv, xb, n, normed, sc.inputs, 0, width);
    matmul(w.net.wAlpha, xb, n, normed, sc.inputs, ch, width);
    matmul(w.net.wBeta, xb, n, normed, sc.inputs, ch + nV, width);
    matmul(w.net.wz, xb, n, normed, sc.z, 0, nV * d);
    const [gx, gy] = grid2d(Math.ceil((n * nV) / 64));
    rec.dispatch({ kernel: 'delta_net_gates', params: [n * nV, nV, ch, gx], buffers: [sc.inputs, w.net.dtBias, w.net.a], groups: [gx, gy] });
    recordDeltaTokens(rec, state, w.net.conv, sc.inputs, sc.o, n, rows, c.rmsEps);
    // RMSNorm per head, gated by SiLU(z) (swiglu: z ← silu(z) · normed), the output projection
    op.rmsNorm(rec, sc.o, 0, d, w.net.norm, sc.normed, 0, d, d, n * nV, c.rmsEps);
    op.swiglu(rec, sc.z, sc.normed, n * nV * d);
    matmul(w.net.wOut, sc.z, n, new Map(), out, 0, c.nEmbd);
  }

  private scratchFor(n: number): DeltaScratch {
    if (this.scratch && this.scratch.tokens >= n) return this.scratch;
    this.dispose();
    const la = this.config.linearAttention!;
    const vDim = la.nVHeads * la.headDim;
    const buf = (label: string, elements: number) => this.memory.create(`delta ${label}`, elements * 4, ACTIVATION);
    this.scratch = { tokens: n, inputs: buf('inputs', n * deltaInputWidth(la)), z: buf('z', n * vDim), o: buf('o', n * vDim), normed: buf('normed', n * vDim) };
    return this.scratch;
  }

  dispose(): void {
    const sc = this.scratch;
    if (!sc) return;
    for (const b of [sc.inputs, sc.z, sc.o, sc.normed]) this.memory.destroy(b);
    this.scratch = null;
  }
}
