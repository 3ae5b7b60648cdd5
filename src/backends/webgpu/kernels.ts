// Compiled kernels and the recording of one submission.
//
// KernelLibrary compiles each (kernel, type variant, entry point) once and caches the pipeline
// in a Map under a readable label such as `mul_mat_vec_sg_q4_k` or `attention_decode_split_f16`.
// Recorder collects a forward pass's dispatches — each with its own small uniform block of
// parameters, packed into one shared uniform buffer — and encodes them into a single compute
// pass and a single queue submission: buffer copies that must come first (a growing KV cache),
// the pass, then a copy out for readback.

import { BufferUsage, MapMode } from './usage.ts';
import { assembleShader, REDUCING_KERNELS } from './shader-library.ts';
import type { KvType, QuantKind, ReduceKind, ShaderSources } from './shader-library.ts';
import type { GpuMemory } from './gpu-memory.ts';

/** WebGPU caps a dispatch dimension at 65,535 workgroups. */
export const MAX_WORKGROUPS_PER_DIM = 65535;
/** Bytes reserved per dispatch in the uniform buffer (≥ minUniformBufferOffsetAlignment). */
const PARAM_SLOT = 256;

export class KernelLibrary {
  private readonly pipelines = new Map<string, GPUComputePipeline>();

  /** how reducing kernels sum across a workgroup: subgroup operations when the device has them */
  readonly reduce: ReduceKind;

  constructor(
    readonly device: GPUDevice,
    private readonly sources: ShaderSources,
    reduce?: ReduceKind,
  ) {
    this.reduce = reduce ?? (device.features.has('subgroups') ? 'subgroup' : 'shared');
  }

  /** e.g. mul_mat_vec_q4_k, mul_mat_vec_sg_q4_k (subgroup reduction), attention_decode_split */
  label(kernel: string, quant?: QuantKind | KvType, entry = 'main'): string {
    const sg = REDUCING_KERNELS.has(kernel) && this.reduce === 'subgroup' ? 'sg' : '';
    return [kernel, sg, entry === 'main' ? '' : entry, quant ?? ''].filter(Boolean).join('_');
  }

  /** `quant`: the kernel's type variant (weight type, or KV element type for attention) */
  pipeline(kernel: string, quant?: QuantKind | KvType, entry = 'main'): GPUComputePipeline {
    const label = this.label(kernel, quant, entry);
    let p = this.pipelines.get(label);
    if (!p) {
      const module = this.device.createShaderModule({ label, code: assembleShader(this.sources, kernel, quant, this.reduce) });
      p = this.device.createComputePipeline({ label, layout: 'auto', compute: { module, entryPoint: entry } });
      this.pipelines.set(label, p);
    }
    return p;
  }

  /**
   * Compiles these pipelines ahead of use, in parallel (createComputePipelineAsync), so the
   * first forward pays no compile time and a shader that fails to compile fails the load.
   */
  async prepare(wanted: readonly { kernel: string; quant?: QuantKind | KvType; entry?: string }[]): Promise<void> {
    await Promise.all(
      wanted.map(async ({ kernel, quant, entry = 'main' }) => {
        const label = this.label(kernel, quant, entry);
        if (this.pipelines.has(label)) return;
        const module = this.device.createShaderModule({ label, code: assembleShader(this.sources, kernel, quant, this.reduce) });
        const p = await this.device.createComputePipelineAsync({ label, layout: 'auto', compute: { module, entryPoint: entry } });
        this.pipelines.set(label, p);
      }),
    );
  }

  /** labels of every compiled pipeline (for tests and benchmarks) */
  get labels(): string[] {
    return [...this.pipelines.keys()];
  }
}

/** A uniform parameter: plain numbers are u32, `f32(x)` marks a float. */
export type Param = number | { f32: number };
export const f32 = (x: number): Param => ({ f32: x });

export interface DispatchSpec {
  kernel: string;
  /** type variant: weight type, or KV element type for attention kernels */
  quant?: QuantKind | KvType;
  entry?: string;
  params: Param[];
  /** buffers for bindings 1, 2, …; `undefined` skips a binding the entry point does not use */
  buffers: (GPUBuffer | undefined)[];
  /** workgroup counts (each ≤ 65,535) */
  groups: [number, number?, number?];
  /** bytes of weights the dispatch reads (each byte once however often it is used), for accounting */
  reads?: number;
}

/** x/y workgroup counts covering `n` workgroups in a grid no wider than 65,535. */
export function grid2d(n: number): [number, number] {
  if (n <= MAX_WORKGROUPS_PER_DIM) return [Math.max(1, n), 1];
  const y = Math.ceil(n / MAX_WORKGROUPS_PER_DIM);
  return [Math.ceil(n / y), y];
}

/**
 * Shared per-stage resources the recorder reuses between submissions: the uniform buffer
 * and the readback staging buffer, both grown on demand.
 */
export class SubmitResources {
  private uniforms: GPUBuffer | null = null;
  private staging: GPUBuffer | null = null;
  /** queue submissions made through recorders sharing these resources */
  submissions = 0;
  /** bytes copied back to the host */
  readbackBytes = 0;
  /** weight bytes the submitted dispatches read (DispatchSpec.reads) */
  weightBytesRead = 0;

  constructor(private readonly memory: GpuMemory) {}

  uniformBuffer(bytes: number): GPUBuffer {
    if (!this.uniforms || this.uniforms.size < bytes) {
      this.memory.destroy(this.uniforms);
      this.uniforms = this.memory.create('params', Math.max(bytes, 64 * PARAM_SLOT), BufferUsage.UNIFORM | BufferUsage.COPY_DST);
    }
    return this.uniforms;
  }

  stagingBuffer(bytes: number): GPUBuffer {
    if (!this.staging || this.staging.size < bytes) {
      this.memory.destroy(this.staging);
      this.staging = this.memory.create('readback', bytes, BufferUsage.MAP_READ | BufferUsage.COPY_DST);
    }
    return this.staging;
  }

  dispose(): void {
    this.memory.destroy(this.uniforms);
    this.memory.destroy(this.staging);
    this.uniforms = this.staging = null;
  }
}

export class Recorder {
  private readonly dispatches: DispatchSpec[] = [];
  private readonly copies: { src: GPUBuffer; dst: GPUBuffer; bytes: number }[] = [];

  constructor(
    private readonly lib: KernelLibrary,
    private readonly resources: SubmitResources,
  ) {}

  dispatch(spec: DispatchSpec): void {
    this.dispatches.push(spec);
  }

  /** a buffer-to-buffer copy (from offset 0 to offset 0) that runs before the dispatches */
  copyBefore(src: GPUBuffer, dst: GPUBuffer, bytes: number): void {
    this.copies.push({ src, dst, bytes });
  }

  get length(): number {
    return this.dispatches.length;
  }

  /**
   * Encodes every dispatch into one compute pass, submits once, and (when asked) copies
   * `readback.bytes` bytes from `readback.buffer` at `readback.offset` back to the host.
   */
  async submit(readback?: { buffer: GPUBuffer; offset: number; bytes: number }): Promise<ArrayBuffer | undefined> {
    const device = this.lib.device;
    const n = this.dispatches.length;
    const uniforms = this.resources.uniformBuffer(Math.max(1, n) * PARAM_SLOT);
    const data = new ArrayBuffer(Math.max(1, n) * PARAM_SLOT);
    const u32 = new Uint32Array(data);
    const fl = new Float32Array(data);
    this.dispatches.forEach((d, i) => {
      const base = (i * PARAM_SLOT) / 4;
      d.params.forEach((p, j) => {
        if (typeof p === 'number') u32[base + j] = p;
        else fl[base + j] = p.f32;
      });
    });
    if (n > 0) device.queue.writeBuffer(uniforms, 0, data, 0, n * PARAM_SLOT);
    for (const d of this.dispatches) this.resources.weightBytesRead += d.reads ?? 0;

    const encoder = device.createCommandEncoder();
    for (const c of this.copies) encoder.copyBufferToBuffer(c.src, 0, c.dst, 0, c.bytes);
    this.copies.length = 0;
    if (n > 0) {
      const pass = encoder.beginComputePass();
      this.dispatches.forEach((d, i) => {
        const pipeline = this.lib.pipeline(d.kernel, d.quant, d.entry ?? 'main');
        const paramBytes = Math.ceil((d.params.length * 4) / 16) * 16;
        const entries: GPUBindGroupEntry[] = [{ binding: 0, resource: { buffer: uniforms, offset: i * PARAM_SLOT, size: paramBytes } }];
        d.buffers.forEach((b, j) => {
          if (b) entries.push({ binding: j + 1, resource: { buffer: b } });
        });
        const bindGroup = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries });
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, bindGroup);
        pass.dispatchWorkgroups(d.groups[0], d.groups[1] ?? 1, d.groups[2] ?? 1);
      });
      pass.end();
    }
    let staging: GPUBuffer | undefined;
    if (readback) {
      staging = this.resources.stagingBuffer(readback.bytes);
      encoder.copyBufferToBuffer(readback.buffer, readback.offset, staging, 0, readback.bytes);
    }
    device.queue.submit([encoder.finish()]);
    this.resources.submissions++;
    this.dispatches.length = 0;
    if (!staging || !readback) return undefined;
    await staging.mapAsync(MapMode.READ, 0, readback.bytes);
    const out = staging.getMappedRange(0, readback.bytes).slice(0);
    this.resources.readbackBytes += readback.bytes;
    staging.unmap();
    return out;
  }
}
