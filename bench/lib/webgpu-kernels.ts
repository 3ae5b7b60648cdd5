// Kernel figures of `npm run bench -- webgpu`: GB/s of each mat-vec and mat-mat kernel, of the
// attention kernels and of rms_norm, against a plain copy kernel's GB/s on the same adapter.
// Each figure times many dispatches in one submission (so a fast GPU is not timed on submit
// overhead) over several copies of the weights (so a matrix that fits the GPU's cache is not
// read from it).

import { matmul as cpuMatmul } from '../../src/backends/cpu/ops.ts';
import { acquireDevice } from '../../src/backends/webgpu/device.ts';
import type { AdapterSummary } from '../../src/backends/webgpu/device.ts';
import { GpuMemory } from '../../src/backends/webgpu/gpu-memory.ts';
import { KernelLibrary, Recorder, SubmitResources, grid2d } from '../../src/backends/webgpu/kernels.ts';
import { uploadMatrix } from '../../src/backends/webgpu/matrix.ts';
import type { GpuMatrix } from '../../src/backends/webgpu/matrix.ts';
import { nodeGpu } from '../../src/backends/webgpu/node.ts';
import * as op from '../../src/backends/webgpu/ops.ts';
import type { MatVecKernel } from '../../src/backends/webgpu/ops.ts';
import { loadShaderSources } from '../../src/backends/webgpu/shaders-node.ts';
import { quantize } from '../../src/gguf/quantize.ts';
import { TYPE_TRAITS } from '../../src/gguf/types.ts';
import type { GgmlType } from '../../src/gguf/types.ts';
import { lcgCentered } from '../../test/support/prng.ts';

export interface KernelFigure {
  kernel: string;
  shape: string;
  /** per dispatch */
  ms: number;
  gb_s: number;
  gflop_s: number;
  /** gb_s / the copy kernel's gb_s */
  of_copy?: number;
}

export interface KernelShapes {
  /** mat-vec k (columns) and rows */
  k: number;
  rows: number;
  /** attention positions and queries */
  attnCtx: number;
  attnQueries: number;
  /** bytes the copy kernel moves (read) */
  copyBytes: number;
  /** dispatches per submission */
  inner: number;
  reps: number;
}

function random(n: number, seed: number): Float32Array {
  const next = lcgCentered(seed);
  return Float32Array.from({ length: n }, next);
}

const COPY_WGSL = `
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
  let i = g.x + g.y * n.x * 256u;
  if (i < arrayLength(&src)) { dst[i] = src[i]; }
}`;

/** median ms of one submission holding `inner` dispatches recorded by `record(rec, i)` */
async function timeSubmission(device: GPUDevice, lib: KernelLibrary, res: SubmitResources, record: (rec: Recorder, i: number) => void, s: KernelShapes): Promise<number> {
  const once = async () => {
    const rec = new Recorder(lib, res);
    for (let i = 0; i < s.inner; i++) record(rec, i);
    const t0 = performance.now();
    await rec.submit();
    await device.queue.onSubmittedWorkDone();
    return (performance.now() - t0) / s.inner;
  };
  await once(); // compile + warm
  const times: number[] = [];
  for (let i = 0; i < s.reps; i++) times.push(await once());
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)]!;
}

/** GB/s of a plain copy (bytes read + bytes written) */
async function copyGbs(device: GPUDevice, memory: GpuMemory, s: KernelShapes): Promise<KernelFigure> {
  const module = device.createShaderModule({ label: 'bench copy', code: COPY_WGSL });
  const pipeline = device.createComputePipeline({ label: 'bench copy', layout: 'auto', compute: { module, entryPoint: 'main' } });
  const bytes = Math.floor(Math.min(s.copyBytes, device.limits.maxStorageBufferBindingSize) / 16) * 16;
  const src = memory.create('copy src', bytes, 0x0080 | 0x0008);
  const dst = memory.create('copy dst', bytes, 0x0080 | 0x0004);
  const bind = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: [{ binding: 0, resource: { buffer: src } }, { binding: 1, resource: { buffer: dst } }] });
  const [gx, gy] = grid2d(Math.ceil(bytes / 16 / 256));
  const once = async () => {
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bind);
    for (let i = 0; i < s.inner; i++) pass.dispatchWorkgroups(gx, gy);
    pass.end();
    const t0 = performance.now();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    return (performance.now() - t0) / s.inner;
  };
  await once();
  const times: number[] = [];
  for (let i = 0; i < s.reps; i++) times.push(await once());
  const ms = times.sort((a, b) => a - b)[Math.floor(times.length / 2)]!;
  memory.destroy(src);
  memory.destroy(dst);
  return { kernel: 'copy', shape: `${bytes} bytes`, ms, gb_s: (2 * bytes) / ms / 1e6, gflop_s: 0 };
}

export async function kernelFigures(s: KernelShapes, types: readonly GgmlType[]): Promise<{ adapter: AdapterSummary; kernels: KernelFigure[] }> {
  const { device, adapter } = await acquireDevice(await nodeGpu(), 'bench');
  const memory = new GpuMemory(device);
  const lib = new KernelLibrary(device, loadShaderSources());
  const res = new SubmitResources(memory);
  const figures: KernelFigure[] = [];
  const copy = await copyGbs(device, memory, s);
  figures.push(copy);
  const storage = (n: number) => memory.create('x', n * 4, 0x0080 | 0x0008 | 0x0004);
  const { k, rows } = s;
  const batch = 64;
  const x = memory.upload('x', random(batch * k, 1));
  const out = storage(batch * rows);
  const values = random(k * rows, 2);
  const figure = (kernel: string, shape: string, ms: number, bytes: number, flops: number): KernelFigure => {
    const gb = bytes / ms / 1e6;
    return { kernel, shape, ms, gb_s: gb, gflop_s: flops / ms / 1e6, of_copy: Math.round((gb / copy.gb_s) * 1000) / 1000 };
  };
  for (const type of types) {
    const bytes = quantize(type, values, k);
    // enough copies that the dispatches in one submission do not read one cached matrix
    const copies = Math.max(1, Math.min(8, Math.ceil((256 << 20) / bytes.byteLength)));
    const ws: GpuMatrix[] = Array.from({ length: copies }, () => uploadMatrix(memory, 'w', type, [k, rows], bytes, adapter.maxStorageBufferBindingSize));
    const name = TYPE_TRAITS[type]!.name.toLowerCase();
    for (const kernel of ['mul_mat_vec', 'mul_mat'] as MatVecKernel[]) {
      const ms = await timeSubmission(device, lib, res, (rec, i) => op.matmul(rec, ws[i % copies]!, x, 0, out, 0, rows, 1, kernel), s);
      figures.push(figure(`${kernel}_${name}`, `[${rows}×${k}]·[${k}]`, ms, bytes.byteLength + k * 4 + rows * 4, 2 * k * rows));
    }
    for (const kernel of ['mul_mat', 'mul_mat_tiled'] as const) {
      const ms = await timeSubmission(device, lib, res, (rec, i) => op.matmul(rec, ws[i % copies]!, x, 0, out, 0, rows, batch, 'mul_mat_vec', kernel), s);
      figures.push(figure(`${kernel}_${name}`, `[${rows}×${k}]·[${k}×${batch}]`, ms, bytes.byteLength + batch * (k + rows) * 4, 2 * k * rows * batch));
    }
    for (const w of ws) for (const c of w.chunks) memory.destroy(c.buffer);
  }
  // attention over an attnCtx-position cache: 32 heads of 128, 8 KV heads
  const shape = { nHead: 32, nHeadKv: 8, headDim: 128 };
  const kv = s.attnCtx * shape.nHeadKv * shape.headDim;
  const kc = memory.upload('k', random(kv, 3));
  const vc = memory.upload('v', random(kv, 4));
  const q = memory.upload('q', random(batch * shape.nHead * shape.headDim, 5));
  const att = storage(batch * shape.nHead * shape.headDim);
  const partial = storage(op.attentionPartialElements(shape, s.attnCtx));
  const kvBytes = 2 * kv * 4;
  let ms = await timeSubmission(device, lib, res, (rec) => op.attentionDecode(rec, shape, q, 0, kc, vc, partial, att, s.attnCtx), s);
  figures.push(figure('attention_decode', `32 heads × 128, GQA 8, ${s.attnCtx} positions`, ms, kvBytes, 4 * shape.nHead * shape.headDim * s.attnCtx));
  ms = await timeSubmission(device, lib, res, (rec) => op.attentionPrefill(rec, shape, q, kc, vc, att, s.attnQueries, s.attnCtx - s.attnQueries), s);
  figures.push(figure('attention_prefill', `${s.attnQueries} queries, 32 heads × 128, GQA 8, ≤${s.attnCtx} positions`, ms, kvBytes, 4 * shape.nHead * shape.headDim * s.attnCtx * s.attnQueries));
  const normW = memory.upload('nw', random(k, 6));
  ms = await timeSubmission(device, lib, res, (rec) => op.rmsNorm(rec, x, 0, k, normW, out, 0, k, k, batch, 1e-5), s);
  figures.push(figure('rms_norm', `${batch}×${k}`, ms, 2 * batch * k * 4, 3 * batch * k));
  res.dispose();
  memory.destroyAll();
  device.destroy();
  // the CPU reference's plain JS matmul on the same f32 weights, for scale
  const xs = random(k, 7);
  const y = new Float32Array(rows);
  const t0 = performance.now();
  cpuMatmul(y, xs, values, 1, k, rows);
  const cpuMs = performance.now() - t0;
  figures.push({ kernel: 'cpu_reference_js_matmul_f32', shape: `[${rows}×${k}]·[${k}]`, ms: cpuMs, gb_s: (k * rows * 4) / cpuMs / 1e6, gflop_s: (2 * k * rows) / cpuMs / 1e6 });
  return { adapter, kernels: figures };
}
