// One Gated DeltaNet layer's session state on the GPU and the dispatches that advance it, in
// the chunked form of the CPU reference (../cpu/delta-chunk.ts, same symbols):
// shaders/delta_net_step.wgsl per token, shaders/delta_net_fold.wgsl at each chunk end (chunks
// at absolute multiples of CHUNK). The host keeps where the chunk is (session-recurrent.ts);
// the buffers hold S₀, the chunk's rows and the conv inputs.

import { MeshError } from '../../errors.ts';
import type { LinearAttentionConfig } from '../../model/config.ts';
import { CHUNK } from '../cpu/delta-chunk.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { f32 } from './kernels.ts';
import type { Recorder } from './kernels.ts';
import { BufferUsage } from './usage.ts';

/** The step kernel keeps a head in one workgroup of 256 invocations. */
export const DELTA_MAX_HEAD_DIM = 256;

const STATE_USAGE = BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC;

/** floats per token of a step's inputs: [channels | g | β] */
export function deltaInputWidth(la: LinearAttentionConfig): number {
  return la.convChannels + 2 * la.nVHeads;
}

export function checkDeltaShapes(la: LinearAttentionConfig): void {
  if (la.headDim > DELTA_MAX_HEAD_DIM || CHUNK > la.headDim) {
    throw new MeshError('UNSUPPORTED_TENSOR_LAYOUT', `DeltaNet head size ${la.headDim} must be in [${CHUNK}, ${DELTA_MAX_HEAD_DIM}] for the WGSL step`);
  }
}

/** f32 bytes of one layer's state: S₀, the chunk's keys, V' rows and decays, the conv inputs. */
export function gpuDeltaLayerBytes(la: LinearAttentionConfig): number {
  const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = la;
  return 4 * (nV * d * d + CHUNK * (nK * d + nV * d + nV) + (K - 1 + CHUNK) * ch);
}

/** One layer's state buffers (f32). */
export class GpuDeltaState {
  readonly buffers: Record<'conv' | 's0' | 'krows' | 'vp' | 'gc', GPUBuffer>;

  constructor(
    private readonly memory: GpuMemory,
    label: string,
    readonly la: LinearAttentionConfig,
  ) {
    const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = la;
    const make = (name: string, floats: number) => memory.create(`${name} ${label}`, 4 * floats, STATE_USAGE);
    this.buffers = {
      conv: make('conv', (K - 1 + CHUNK) * ch),
      s0: make('s0', nV * d * d),
      krows: make('krows', CHUNK * nK * d),
      vp: make('vp', CHUNK * nV * d),
      gc: make('gc', CHUNK * nV),
    };
  }

  get bytes(): number {
    return gpuDeltaLayerBytes(this.la);
  }

  /** zeroes S₀ and the conv rows (a rewind to 0; new buffers start zeroed) */
  clear(): void {
    const q = this.memory.device.queue;
    for (const b of [this.buffers.s0, this.buffers.conv]) q.writeBuffer(b, 0, new Float32Array(b.size / 4));
  }

  /** copies every buffer of `from` into this one, recorded before `rec`'s dispatches (or now when rec is omitted) */
  copyFrom(from: GpuDeltaState, rec?: Recorder): void {
    const names = Object.keys(this.buffers) as (keyof GpuDeltaState['buffers'])[];
    if (rec) {
      for (const n of names) rec.copyBefore(from.buffers[n], this.buffers[n], this.buffers[n].size);
      return;
    }
    const enc = this.memory.device.createCommandEncoder({ label: 'delta state copy' });
    for (const n of names) enc.copyBufferToBuffer(from.buffers[n], 0, this.buffers[n], 0, this.buffers[n].size);
    this.memory.device.queue.submit([enc.finish()]);
  }

  free(): void {
    for (const b of Object.values(this.buffers)) this.memory.destroy(b);
  }
}

/**
 * n tokens of one layer: inputs [n × (channels + 2·nV)] (q|k|v mix, g, β; gates applied), conv
 * taps [channels × K]; writes o [n × nV × d] (before the gated norm). `rows`: tokens of the
 * current chunk before these; a fold is recorded at each chunk end.
 */
export function recordDeltaTokens(rec: Recorder, st: GpuDeltaState, taps: GPUBuffer, inputs: GPUBuffer, out: GPUBuffer, n: number, rows: number, eps: number): void {
  const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = st.la;
  const b = st.buffers;
  let t = rows;
  for (let tok = 0; tok < n; tok++) {
    rec.dispatch({ kernel: 'delta_net_step', params: [t, nK, nV, d, K, ch, f32(eps), tok], buffers: [inputs, taps, b.conv, b.s0, b.krows, b.vp, b.gc, out], groups: [nV] });
    t++;
    if (t === CHUNK) {
      const groups = Math.ceil((nV * d * d + (K - 1) * ch) / 64);
      const wgX = Math.min(groups, 65535);
      rec.dispatch({ kernel: 'delta_net_fold', params: [t, nK, nV, d, K, ch, wgX, 0], buffers: [b.s0, b.krows, b.vp, b.gc, b.conv], groups: [wgX, Math.ceil(groups / wgX)] });
      t = 0;
    }
  }
}
