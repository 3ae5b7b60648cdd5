// One Gated DeltaNet layer's session state on the GPU and its token step, in the chunked form
// of the CPU reference (../cpu/delta-chunk.ts): shaders/delta_net_step.wgsl per token,
// shaders/delta_net_fold.wgsl at each chunk end. The WGSL forward pass does not run Qwen3.5
// yet; this is the kernel pair and its state, checked against the CPU reference token for
// token (test/webgpu-delta-net.test.ts), for that pass to build on.

import { MeshError } from '../../errors.ts';
import type { LinearAttentionConfig } from '../../model/config.ts';
import { CHUNK } from '../cpu/delta-chunk.ts';
import type { KernelLibrary } from './kernels.ts';
import { BufferUsage, MapMode } from './usage.ts';

/** The step kernel keeps a head in one workgroup of 256 invocations. */
const MAX_HEAD_DIM = 256;

export class GpuDeltaNetLayer {
  private readonly buffers: Record<'inputs' | 'taps' | 'conv' | 's0' | 'krows' | 'vp' | 'gc' | 'out' | 'read', GPUBuffer>;
  /** tokens of the current chunk */
  private rows = 0;
  /** this step's parameter blocks, destroyed once it has run */
  private uniforms: GPUBuffer[] = [];

  constructor(
    private readonly lib: KernelLibrary,
    private readonly la: LinearAttentionConfig,
    /** [channels × K] the layer's ssm_conv1d taps */
    taps: Float32Array,
  ) {
    const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = la;
    if (d > MAX_HEAD_DIM || CHUNK > d) {
      throw new MeshError('UNSUPPORTED_TENSOR_LAYOUT', `DeltaNet head size ${d} must be in [${CHUNK}, ${MAX_HEAD_DIM}] for the WGSL step`);
    }
    const dev = lib.device;
    const storage = (floats: number) => dev.createBuffer({ size: 4 * floats, usage: BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC });
    this.buffers = {
      inputs: storage(ch + 2 * nV),
      taps: storage(ch * K),
      conv: storage((K - 1 + CHUNK) * ch),
      s0: storage(nV * d * d),
      krows: storage(CHUNK * nK * d),
      vp: storage(CHUNK * nV * d),
      gc: storage(CHUNK * nV),
      out: storage(nV * d),
      read: dev.createBuffer({ size: 4 * nV * d, usage: BufferUsage.MAP_READ | BufferUsage.COPY_DST }),
    };
    dev.queue.writeBuffer(this.buffers.taps, 0, Float32Array.from(taps));
  }

  /** One token: mixed [channels] before the conv, g and β [nV]; returns o [nV × d] before the gated norm. */
  async step(mixed: Float32Array, g: Float32Array, beta: Float32Array, eps: number): Promise<Float32Array> {
    const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = this.la;
    const dev = this.lib.device;
    const b = this.buffers;
    const inputs = new Float32Array(ch + 2 * nV); // [q|k|v mix | g | β]
    inputs.set(mixed, 0);
    inputs.set(g, ch);
    inputs.set(beta, ch + nV);
    dev.queue.writeBuffer(b.inputs, 0, inputs);
    const enc = dev.createCommandEncoder({ label: 'delta_net' });
    const pass = enc.beginComputePass();
    const stepParams = new ArrayBuffer(32);
    new Uint32Array(stepParams).set([this.rows, nK, nV, d, K, ch]);
    new Float32Array(stepParams, 24, 1)[0] = eps;
    this.dispatch(pass, 'delta_net_step', stepParams, [b.inputs, b.taps, b.conv, b.s0, b.krows, b.vp, b.gc, b.out], [nV, 1]);
    this.rows++;
    if (this.rows === CHUNK) {
      const n = nV * d * d + (K - 1) * ch;
      const groups = Math.ceil(n / 64);
      const wgX = Math.min(groups, 65535);
      const foldParams = new Uint32Array([this.rows, nK, nV, d, K, ch, wgX, 0]);
      this.dispatch(pass, 'delta_net_fold', foldParams.buffer, [b.s0, b.krows, b.vp, b.gc, b.conv], [wgX, Math.ceil(groups / wgX)]);
      this.rows = 0;
    }
    pass.end();
    enc.copyBufferToBuffer(b.out, 0, b.read, 0, 4 * nV * d);
    dev.queue.submit([enc.finish()]);
    await b.read.mapAsync(MapMode.READ);
    const o = new Float32Array(b.read.getMappedRange().slice(0));
    b.read.unmap();
    for (const u of this.uniforms.splice(0)) u.destroy();
    return o;
  }

  dispose(): void {
    for (const buf of Object.values(this.buffers)) buf.destroy();
  }

  private dispatch(pass: GPUComputePassEncoder, kernel: string, params: ArrayBuffer, bindings: GPUBuffer[], groups: [number, number]): void {
    const dev = this.lib.device;
    const pipeline = this.lib.pipeline(kernel);
    const uniform = dev.createBuffer({ size: params.byteLength, usage: BufferUsage.UNIFORM | BufferUsage.COPY_DST });
    dev.queue.writeBuffer(uniform, 0, params);
    this.uniforms.push(uniform);
    const bindGroup = dev.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: uniform } }, ...bindings.map((buffer, i) => ({ binding: i + 1, resource: { buffer } }))],
    });
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(groups[0], groups[1]);
  }
}
