// Every WGSL kernel against the CPU reference ops (src/backends/cpu/ops.ts) on random inputs,
// for every supported weight type, in headless Chromium's WebGPU (SwiftShader). Error is
// normalised like llama.cpp's test-backend-ops: max |gpu - cpu| / max |cpu| ≤ 1e-4.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as cpu from '../../src/backends/cpu/ops.ts';
import { roundActivations } from '../../src/backends/cpu/act-round.ts';
import { dequantize } from '../../src/gguf/dequant.ts';
import { f32ToF16, F16_TABLE } from '../../src/gguf/fp16.ts';
import { quantize } from '../../src/gguf/quantize.ts';
import { GgmlType } from '../../src/gguf/types.ts';
import type { RopeConfig } from '../../src/model/config.ts';
import { acquireDevice } from '../../src/backends/webgpu/device.ts';
import { GpuMemory } from '../../src/backends/webgpu/gpu-memory.ts';
import { KernelLibrary, Recorder, SubmitResources } from '../../src/backends/webgpu/kernels.ts';
import { uploadMatrix } from '../../src/backends/webgpu/matrix.ts';
import * as gpu from '../../src/backends/webgpu/ops.ts';
import { ropeTable } from '../../src/backends/webgpu/rope-table.ts';
import { SHADERS } from '../../src/backends/webgpu/shaders-vite.ts';

const TOL = 1e-4;

let device: GPUDevice;
let memory: GpuMemory;
let lib: KernelLibrary;
let sharedLib: KernelLibrary; // reductions without subgroups, as on adapters that lack them
let resources: SubmitResources;

beforeAll(async () => {
  device = (await acquireDevice(navigator.gpu)).device; // with subgroups where the adapter has them
  memory = new GpuMemory(device);
  lib = new KernelLibrary(device, SHADERS);
  sharedLib = new KernelLibrary(device, SHADERS, 'shared');
  resources = new SubmitResources(memory);
});

afterAll(() => {
  resources.dispose();
  memory.destroyAll();
  device.destroy();
});

function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32 - 0.5;
  };
}

function randomArray(n: number, seed: number, scale = 2): Float32Array {
  const r = seeded(seed);
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = r() * scale;
  return a;
}

function storage(data: Float32Array | Uint32Array | number): GPUBuffer {
  const usage = 0x0004; // COPY_SRC
  if (typeof data === 'number') return memory.create('scratch', data * 4, 0x0080 | 0x0008 | usage);
  return memory.upload('input', data, usage);
}

async function run(rec: Recorder, out: GPUBuffer, n: number, offset = 0): Promise<Float32Array> {
  device.pushErrorScope('validation');
  const bytes = await rec.submit({ buffer: out, offset: offset * 4, bytes: n * 4 });
  const err = await device.popErrorScope();
  if (err) throw new Error(err.message);
  return new Float32Array(bytes!);
}

function relErr(got: Float32Array, want: Float32Array): number {
  expect(got.length).toBe(want.length);
  let maxDiff = 0;
  let maxRef = 0;
  for (let i = 0; i < want.length; i++) {
    maxDiff = Math.max(maxDiff, Math.abs(got[i]! - want[i]!));
    maxRef = Math.max(maxRef, Math.abs(want[i]!));
  }
  if (!Number.isFinite(maxDiff)) return Infinity;
  return maxDiff / Math.max(maxRef, 1e-30);
}

const WEIGHT_TYPES = [
  GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_1, GgmlType.Q5_0, GgmlType.Q5_1,
  GgmlType.Q2_K, GgmlType.Q3_K, GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K, GgmlType.IQ4_NL, GgmlType.IQ4_XS, GgmlType.MXFP4,
];
// the tiled kernel takes each type through the same dequant4 as the others, and its barriers
// are slow on SwiftShader (~8 s a case): the types it was built with, plus an odd-sized block
const TILED_TYPES = new Set([GgmlType.F32, GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.Q6_K, GgmlType.MXFP4]);

describe.each(WEIGHT_TYPES.map((t) => [GgmlType[t], t] as const))('weights %s', (_name, type) => {
  const k = 512; // row length: two Q4_K/Q6_K super-blocks
  const rows = 70;
  const values = randomArray(k * rows, 7 + type);
  const bytes = quantize(type, values, k);
  const w = dequantize(type, bytes, k * rows); // what the GPU must reproduce, [rows × k]

  it.each(['subgroup', 'shared'] as const)('mul_mat_vec: one token, %s reduction', async (reduce) => {
    const m = uploadMatrix(memory, 'w', type, [k, rows], bytes, 1 << 30);
    const x = randomArray(k, 99);
    const out = storage(rows + 3);
    const rec = new Recorder(reduce === 'shared' ? sharedLib : lib, resources);
    gpu.matmul(rec, m, storage(x), 0, out, 3, rows, 1, 'mul_mat_vec');
    const got = await run(rec, out, rows, 3);
    const want = new Float32Array(rows);
    cpu.matmul(want, x, w, 1, k, rows);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('mul_mat: 7 tokens, matrix split over three buffers', async () => {
    const rowBytes = bytes.byteLength / rows;
    const m = uploadMatrix(memory, 'w', type, [k, rows], bytes, rowBytes * 25);
    expect(m.chunks.length).toBe(3);
    const n = 7;
    const x = randomArray(n * k, 5);
    const out = storage(n * rows);
    const rec = new Recorder(lib, resources);
    gpu.matmul(rec, m, storage(x), 0, out, 0, rows, n);
    const got = await run(rec, out, n * rows);
    const want = new Float32Array(n * rows);
    cpu.matmul(want, x, w, n, k, rows);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  // defined only for TILED_TYPES (not skipped: the other types are simply not cases of this kernel's test)
  if (TILED_TYPES.has(type)) it('mul_mat_tiled: 70 tokens (two token tiles), split matrix', async () => {
    const rowBytes = bytes.byteLength / rows;
    const m = uploadMatrix(memory, 'w', type, [k, rows], bytes, rowBytes * 40);
    const n = 70;
    const x = randomArray(n * k, 6);
    const out = storage(n * rows);
    const rec = new Recorder(lib, resources);
    gpu.matmul(rec, m, storage(x), 0, out, 0, rows, n, 'mul_mat_vec', 'mul_mat_tiled');
    const got = await run(rec, out, n * rows);
    const want = new Float32Array(n * rows);
    cpu.matmul(want, x, w, n, k, rows);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('mul_mat as a one-row-per-thread matrix × vector, from an offset', async () => {
    const m = uploadMatrix(memory, 'w', type, [k, rows], bytes, 1 << 30);
    const x = randomArray(3 * k, 11);
    const out = storage(rows);
    const rec = new Recorder(lib, resources);
    gpu.matmul(rec, m, storage(x), 2 * k, out, 0, rows, 1, 'mul_mat');
    const got = await run(rec, out, rows);
    const want = new Float32Array(rows);
    cpu.matmul(want, x.subarray(2 * k), w, 1, k, rows);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('get_rows: embedding lookup from a split table', async () => {
    const rowBytes = bytes.byteLength / rows;
    const m = uploadMatrix(memory, 'emb', type, [k, rows], bytes, rowBytes * 32);
    const ids = new Uint32Array([0, 69, 31, 32, 5, 64]);
    const out = storage(ids.length * k);
    const rec = new Recorder(lib, resources);
    gpu.getRows(rec, m, storage(ids), out, ids.length);
    const got = await run(rec, out, ids.length * k);
    const want = new Float32Array(ids.length * k);
    ids.forEach((id, t) => want.set(w.subarray(id * k, (id + 1) * k), t * k));
    expect(relErr(got, want)).toBeLessThan(TOL);
    // dequantisation itself is exact: every element equal
    expect(Array.from(got)).toEqual(Array.from(want));
  });
});

describe('elementwise and normalisation kernels', () => {
  it.each(['subgroup', 'shared'] as const)('rms_norm with weight, over strided rows, %s reduction', async (reduce) => {
    const n = 96;
    const rows = 5;
    const x = randomArray(rows * n, 1);
    const weight = randomArray(n, 2);
    const out = storage(rows * n);
    const rec = new Recorder(reduce === 'shared' ? sharedLib : lib, resources);
    gpu.rmsNorm(rec, storage(x), 0, n, storage(weight), out, 0, n, n, rows, 1e-5);
    const got = await run(rec, out, rows * n);
    const want = new Float32Array(rows * n);
    cpu.rmsnorm(want, x, weight, rows, n, 1e-5);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it.each([
    ['normal', { mode: 'normal', nRot: 32, freqBase: 10000, freqScale: 1, freqFactors: null }],
    ['neox, partial rotation, linear scaling', { mode: 'neox', nRot: 16, freqBase: 1000000, freqScale: 0.25, freqFactors: null }],
    ['normal with llama3 frequency factors', { mode: 'normal', nRot: 32, freqBase: 500000, freqScale: 1, freqFactors: randomArray(16, 3).map((v) => 1 + Math.abs(v) * 8) }],
  ] as const)('rope %s', async (_n, partial) => {
    const cfg = { extFactor: 0, attnFactor: 1, betaFast: 32, betaSlow: 1, nCtxOrig: 2048, ...partial, freqFactorsTensor: null } as unknown as RopeConfig;
    const nTokens = 6;
    const nHeads = 3;
    const headDim = 32;
    const pos0 = 117;
    const x = randomArray(nTokens * nHeads * headDim, 4);
    const buf = storage(new Float32Array([0, 0, ...x]));
    const rec = new Recorder(lib, resources);
    gpu.rope(rec, buf, 2, storage(ropeTable(cfg, pos0, nTokens)), nTokens, nHeads, headDim, cfg.nRot, cfg.mode === 'neox');
    const got = await run(rec, buf, x.length, 2);
    const want = x.slice();
    cpu.rope(want, nTokens, nHeads, headDim, pos0, cfg);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('softmax over rows', async () => {
    const n = 300;
    const x = randomArray(3 * n, 8, 20);
    const buf = storage(x);
    const rec = new Recorder(lib, resources);
    gpu.softmax(rec, buf, n, 3);
    const got = await run(rec, buf, 3 * n);
    const want = x.slice();
    for (let r = 0; r < 3; r++) cpu.softmax(want, r * n, n);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('swiglu', async () => {
    const n = 1000;
    const g = randomArray(n, 9, 10);
    const u = randomArray(n, 10, 4);
    const gb = storage(g);
    const rec = new Recorder(lib, resources);
    gpu.swiglu(rec, gb, storage(u), n);
    const got = await run(rec, gb, n);
    const want = new Float32Array(n);
    cpu.swiglu(want, g, u);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('add: residual and broadcast bias at an offset', async () => {
    const a = randomArray(200, 12);
    const b = randomArray(200, 13);
    const bias = randomArray(40, 14);
    const ab = storage(new Float32Array([...a]));
    const rec = new Recorder(lib, resources);
    gpu.add(rec, ab, 0, storage(b), 200);
    gpu.add(rec, ab, 40, storage(bias), 160, 40);
    const got = await run(rec, ab, 200);
    const want = a.slice();
    cpu.addInPlace(want, b);
    cpu.addBias(want.subarray(40), bias, 4, 40);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('pack_f16 / unpack_f16 round trip the wire format', async () => {
    const n = 258;
    const x = randomArray(n, 15, 100);
    const packed = storage(n / 2);
    const back = storage(n);
    const rec = new Recorder(lib, resources);
    gpu.packF16(rec, storage(x), packed, n);
    gpu.unpackF16(rec, packed, back, n);
    const got = await run(rec, back, n);
    // f16 conversion on the GPU may round either way: within one f16 ulp of the exact rounding
    for (let i = 0; i < n; i++) {
      const exact = F16_TABLE[f32ToF16(x[i]!)]!;
      expect(Math.abs(got[i]! - exact)).toBeLessThanOrEqual(Math.abs(exact) * 2 ** -10);
    }
  });
});

describe('dispatches past 65,535 workgroups use a 2-D grid', () => {
  it('mul_mat_vec over 70,000 rows (one workgroup per row)', async () => {
    const k = 32;
    const rows = 70_000;
    const w = randomArray(k * rows, 51);
    const m = uploadMatrix(memory, 'tall', GgmlType.F32, [k, rows], quantize(GgmlType.F32, w, k), 1 << 30);
    const x = randomArray(k, 52);
    const out = storage(rows);
    const rec = new Recorder(lib, resources);
    gpu.matmul(rec, m, storage(x), 0, out, 0, rows, 1, 'mul_mat_vec');
    const got = await run(rec, out, rows);
    const want = new Float32Array(rows);
    cpu.matmul(want, x, w, 1, k, rows);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it('add over 64 × 65,536 + 100 elements', async () => {
    const n = 64 * 65_536 + 100;
    const a = randomArray(n, 53);
    const b = randomArray(n, 54);
    const ab = storage(a);
    const rec = new Recorder(lib, resources);
    gpu.add(rec, ab, 0, storage(b), n);
    const got = await run(rec, ab, n);
    cpu.addInPlace(a, b);
    expect(relErr(got, a)).toBeLessThan(TOL);
  });
});

describe('activation rounding as ggml does it', () => {
  it.each(['f16', 'q8_0', 'q8_K'] as const)('%s equals the CPU reference', async (format) => {
    const n = 512;
    const rows = 3;
    const x = randomArray(rows * n, 31, 6);
    x.fill(0, n, n + 256); // an all-zero block
    const out = storage(rows * n);
    const rec = new Recorder(lib, resources);
    gpu.roundActivations(rec, format, storage(x), out, rows * n);
    const got = await run(rec, out, rows * n);
    const want = roundActivations(x, rows, n, format);
    // a value rounded to a different integer would be off by a whole quantisation step (~1%);
    // what may remain is the last bit of a scale (WGSL division is not correctly rounded)
    expect(relErr(got, want)).toBeLessThan(1e-6);
    if (format === 'f16') expect(Array.from(got)).toEqual(Array.from(want));
  });
});

/** f32 values packed two f16 to a u32 (element 2i low), as an f16 KV cache holds them. */
function packHalves(x: Float32Array): Uint32Array {
  const out = new Uint32Array(x.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = f32ToF16(x[2 * i]!) | (f32ToF16(x[2 * i + 1]!) << 16);
  return out;
}

describe.each(['f32', 'f16'] as const)('attention over a %s KV cache (GQA: 6 query heads, 2 KV heads)', (kvType) => {
  const shape = { nHead: 6, nHeadKv: 2, headDim: 32 };
  const kvDim = shape.nHeadKv * shape.headDim;
  const ctx = 200;
  const kRaw = randomArray(ctx * kvDim, 21);
  const vRaw = randomArray(ctx * kvDim, 22);
  // what the kernel sees: the f16 cache holds the values rounded to f16
  const kCache = kvType === 'f32' ? kRaw : kRaw.map((v) => F16_TABLE[f32ToF16(v)]!);
  const vCache = kvType === 'f32' ? vRaw : vRaw.map((v) => F16_TABLE[f32ToF16(v)]!);
  const upload = (x: Float32Array) => storage(kvType === 'f32' ? x : packHalves(x));

  it.each([1, 64, 65, 150])('decode, split-K over %i cached positions', async (nKv) => {
    const q = randomArray(shape.nHead * shape.headDim, 23 + nKv, 4);
    const out = storage(q.length);
    const partial = storage(gpu.attentionPartialElements(shape, nKv));
    const rec = new Recorder(lib, resources);
    gpu.attentionDecode(rec, shape, storage(new Float32Array([...new Float32Array(8), ...q])), 8, upload(kRaw), upload(vRaw), partial, out, nKv, kvType);
    const got = await run(rec, out, q.length);
    const want = new Float32Array(q.length);
    cpu.attention(want, q, kCache, vCache, 1, nKv - 1, shape.nHead, shape.nHeadKv, shape.headDim);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });

  it.each([
    [7, 0],
    [9, 130],
  ])('prefill, causal, %i tokens from position %i', async (n, pos0) => {
    const q = randomArray(n * shape.nHead * shape.headDim, 40 + n, 4);
    const out = storage(q.length);
    const rec = new Recorder(lib, resources);
    gpu.attentionPrefill(rec, shape, storage(q), upload(kRaw), upload(vRaw), out, n, pos0, kvType);
    const got = await run(rec, out, q.length);
    const want = new Float32Array(q.length);
    cpu.attention(want, q, kCache, vCache, n, pos0, shape.nHead, shape.nHeadKv, shape.headDim);
    expect(relErr(got, want)).toBeLessThan(TOL);
  });
});

describe('softmax and attention reduce in one order on every adapter', () => {
  it('give the same bits from a subgroup library and a shared-memory one (both take reduce/shared)', async () => {
    const shape = { nHead: 4, nHeadKv: 2, headDim: 32 };
    const n = 9;
    const pos0 = 100;
    const kvDim = shape.nHeadKv * shape.headDim;
    const k = storage(randomArray((pos0 + n) * kvDim, 71));
    const v = storage(randomArray((pos0 + n) * kvDim, 72));
    const q = storage(randomArray(n * shape.nHead * shape.headDim, 73, 4));
    const rows = randomArray(3 * 300, 74, 20);
    const outputs: { attention: Float32Array; softmax: Float32Array }[] = [];
    for (const l of [lib, sharedLib]) {
      const att = storage(n * shape.nHead * shape.headDim);
      let rec = new Recorder(l, resources);
      gpu.attentionPrefill(rec, shape, q, k, v, att, n, pos0);
      const attention = await run(rec, att, n * shape.nHead * shape.headDim);
      const x = storage(rows);
      rec = new Recorder(l, resources);
      gpu.softmax(rec, x, 300, 3);
      outputs.push({ attention, softmax: await run(rec, x, rows.length) });
    }
    expect(lib.reduce).toBe('subgroup');
    expect(new Uint32Array(outputs[0]!.attention.buffer)).toEqual(new Uint32Array(outputs[1]!.attention.buffer));
    expect(new Uint32Array(outputs[0]!.softmax.buffer)).toEqual(new Uint32Array(outputs[1]!.softmax.buffer));
  });
});

describe('pack_f16 into an f16 KV cache at an offset', () => {
  it('writes whole f16 pairs where the cache rows of a position start', async () => {
    const n = 64;
    const x = randomArray(n, 61, 8);
    const cache = storage(new Uint32Array(100).fill(0xdeadbeef));
    const rec = new Recorder(lib, resources);
    gpu.packF16(rec, storage(x), cache, n, 0, 40); // elements 40.. → words 20..
    device.pushErrorScope('validation');
    const bytes = await rec.submit({ buffer: cache, offset: 0, bytes: 400 });
    expect(await device.popErrorScope()).toBeNull();
    const words = new Uint32Array(bytes!);
    expect(words[19]).toBe(0xdeadbeef);
    for (let i = 0; i < n; i++) {
      const half = F16_TABLE[(words[20 + (i >> 1)]! >>> ((i & 1) * 16)) & 0xffff]!;
      expect(Math.abs(half - x[i]!)).toBeLessThanOrEqual(Math.abs(x[i]!) * 2 ** -10); // within f16 rounding
    }
    expect(words[52]).toBe(0xdeadbeef);
  });
});

describe('pipeline cache', () => {
  it('keys pipelines by readable labels', () => {
    expect(lib.reduce).toBe('subgroup'); // SwiftShader has the subgroups feature
    expect(sharedLib.labels).toEqual(expect.arrayContaining(['mul_mat_vec_q4_k', 'rms_norm']));
    expect(lib.labels).toEqual(expect.arrayContaining(['mul_mat_vec_sg_q4_k', 'rms_norm_sg', 'mul_mat_q6_k', 'get_rows_q8_0', 'attention_decode_split_f32', 'attention_decode_combine_f16', 'attention_prefill_f16', 'round_activations_q8_k']));
  });
});
