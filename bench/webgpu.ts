// `npm run bench -- webgpu [--type q4_k_m] [--arch llama] [--layers 4] [--embd 512] [--ffn 1536] [--heads 8]
//   [--kv-heads 4] [--vocab 2048] [--prompt 64] [--decode 16] [--kernel-k 1024] [--kernel-rows 1024]
//   [--kernel-types f32,q5_k,…] [--experts 8] [--experts-used 2] [--expert-ffn 512]
//   [--attn-ctx 512] [--attn-queries 16] [--reps 3] [--backends webgpu,cpu,llamacpp]`
// Kernels are timed for the six original weight types plus those --type's model holds (or the
// --kernel-types list). With a MoE --arch (qwen3moe, qwen2moe) the JSON also says how many
// weight bytes one decoded token reads — by the kernels' own accounting — beside the audit's
// active bytes per token and the model's total.
// (defaults sized so the whole run stays near a minute on SwiftShader; pass GPU-sized shapes,
// e.g. --kernel-k 4096 --kernel-rows 4096 --attn-ctx 4096 --attn-queries 64, on real hardware)
//
// WebGPU (Dawn in this process; SwiftShader where there is no GPU) against the CPU reference
// and llama.cpp in the same run: per-kernel GB/s and GFLOP/s, then prefill and decode tok/s
// of a synthetic model. Prints one JSON document. On SwiftShader the numbers measure a CPU
// emulating a GPU (barriers are very slow there), so they check that things run, not speed.

import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { matmul as cpuMatmul } from '../src/backends/cpu/ops.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { acquireDevice } from '../src/backends/webgpu/device.ts';
import { GpuMemory } from '../src/backends/webgpu/gpu-memory.ts';
import { KernelLibrary, Recorder, SubmitResources } from '../src/backends/webgpu/kernels.ts';
import { uploadMatrix } from '../src/backends/webgpu/matrix.ts';
import { createNodeWebGpuBackend, nodeGpu } from '../src/backends/webgpu/node.ts';
import * as op from '../src/backends/webgpu/ops.ts';
import type { MatVecKernel } from '../src/backends/webgpu/ops.ts';
import { loadShaderSources } from '../src/backends/webgpu/shaders-node.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { quantize } from '../src/gguf/quantize.ts';
import { GgmlType, TYPE_TRAITS } from '../src/gguf/types.ts';
import { auditHeader } from '../src/audit/report.ts';
import { createNodeWebGpuStage } from '../src/backends/webgpu/node.ts';
import { QUANT_OF_TYPE } from '../src/backends/webgpu/shader-library.ts';
import { configFromHeader, loadRopeFreqFactors, ROPE_FACTOR_TENSORS } from '../src/model/config.ts';
import { argmax } from '../src/model/sampler.ts';
import type { MakeModelOptions, ModelType, SyntheticArch } from '../src/model/synthetic-model.ts';
import { syntheticModelSpec } from '../src/model/synthetic-model.ts';
import { lcgCentered } from '../test/support/prng.ts';
import { syntheticModel } from '../test/support/synthetic.ts';

function option(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1]! : fallback;
}

function random(n: number, seed: number): Float32Array {
  const next = lcgCentered(seed);
  return Float32Array.from({ length: n }, next);
}

interface KernelFigure {
  kernel: string;
  shape: string;
  ms: number;
  gb_s: number;
  gflop_s: number;
}

/** Median time of `reps` submissions of what `record` puts on a recorder. */
async function timeKernel(device: GPUDevice, lib: KernelLibrary, res: SubmitResources, record: (rec: Recorder) => void, reps: number): Promise<number> {
  const once = async () => {
    const rec = new Recorder(lib, res);
    record(rec);
    const t0 = performance.now();
    await rec.submit();
    await device.queue.onSubmittedWorkDone();
    return performance.now() - t0;
  };
  await once(); // compile + warm
  const times: number[] = [];
  for (let i = 0; i < reps; i++) times.push(await once());
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)]!;
}

const ORIGINAL_TYPES = [GgmlType.F32, GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.Q6_K];

/** The weight types to time: the original six and the matrices' types of the benchmark model, or an explicit list. */
function kernelTypes(model: MakeModelOptions, list: string): GgmlType[] {
  if (list) {
    return list.split(',').map((name) => {
      const t = GgmlType[name.trim().toUpperCase() as keyof typeof GgmlType];
      if (t === undefined || !QUANT_OF_TYPE[t]) throw new Error(`--kernel-types: no WebGPU snippet for '${name}'`);
      return t;
    });
  }
  const inModel = syntheticModelSpec({ ...model, headerOnly: true }).tensors.filter((t) => t.shape.length > 1).map((t) => t.type);
  return [...new Set([...ORIGINAL_TYPES, ...inModel])];
}

/**
 * Decode on the WebGPU stage of a MoE model: weight bytes the kernels read per token (their
 * own accounting, DispatchSpec.reads) beside the audit's active bytes per token and the total.
 */
async function moeDecodeBytes(path: string, prompt: number[], nDecode: number): Promise<Record<string, number>> {
  const source = await openTensorSource(path);
  const stage = await createNodeWebGpuStage();
  try {
    const config = configFromHeader(source.header);
    await loadRopeFreqFactors(config, source);
    const infos = source.header.tensors.filter((t) => !ROPE_FACTOR_TENSORS.includes(t.name));
    const bytes = await source.read(infos);
    await stage.load({ config, shard: { start: 0, end: config.nLayer }, artifact: path, tensors: infos.map((t) => ({ name: t.name, type: t.type, shape: [...t.shape], bytes: bytes.get(t.name)! })) });
    await stage.openSession('moe', prompt.length + nDecode + 1);
    let out = (await stage.forward('moe', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
    const before = stage.transferStats().weightBytesRead;
    for (let i = 0; i < nDecode; i++) {
      const next = out.kind === 'logits' ? argmax(out.logits) : 0;
      out = (await stage.forward('moe', { kind: 'tokens', tokens: Int32Array.of(next) }, prompt.length + i)).output;
    }
    const audit = auditHeader(source.header, path);
    return {
      total_weight_bytes: infos.reduce((a, t) => a + t.byteLength, 0),
      expert_bytes: audit.expert_bytes,
      active_weight_bytes_per_token: audit.active_weight_bytes_per_token,
      decode_weight_bytes_read_per_token: Math.round((stage.transferStats().weightBytesRead - before) / nDecode),
    };
  } finally {
    await stage.dispose();
    stage.device.destroy();
    await source.close();
  }
}

async function kernelFigures(k: number, rows: number, attnCtx: number, attnQueries: number, reps: number, types: GgmlType[]): Promise<{ adapter: unknown; kernels: KernelFigure[] }> {
  const { device, adapter } = await acquireDevice(await nodeGpu(), 'bench');
  const memory = new GpuMemory(device);
  const lib = new KernelLibrary(device, loadShaderSources());
  const res = new SubmitResources(memory);
  const figures: KernelFigure[] = [];
  const storage = (n: number) => memory.create('x', n * 4, 0x0080 | 0x0008 | 0x0004);
  const batch = 64;
  const x = memory.upload('x', random(batch * k, 1));
  const out = storage(batch * rows);
  const values = random(k * rows, 2);
  for (const type of types) {
    const bytes = quantize(type, values, k);
    const w = uploadMatrix(memory, 'w', type, [k, rows], bytes, adapter.maxStorageBufferBindingSize);
    const name = TYPE_TRAITS[type]!.name.toLowerCase();
    for (const kernel of ['mul_mat_vec', 'mul_mat'] as MatVecKernel[]) {
      const ms = await timeKernel(device, lib, res, (rec) => op.matmul(rec, w, x, 0, out, 0, rows, 1, kernel), reps);
      figures.push({ kernel: `${kernel}_${name}`, shape: `[${rows}×${k}]·[${k}]`, ms, gb_s: (bytes.byteLength + k * 4) / ms / 1e6, gflop_s: (2 * k * rows) / ms / 1e6 });
    }
    for (const kernel of ['mul_mat', 'mul_mat_tiled'] as const) {
      const ms = await timeKernel(device, lib, res, (rec) => op.matmul(rec, w, x, 0, out, 0, rows, batch, 'mul_mat_vec', kernel), reps);
      figures.push({ kernel: `${kernel}_${name}`, shape: `[${rows}×${k}]·[${k}×${batch}]`, ms, gb_s: (bytes.byteLength + batch * k * 4) / ms / 1e6, gflop_s: (2 * k * rows * batch) / ms / 1e6 });
    }
    for (const c of w.chunks) memory.destroy(c.buffer);
  }
  // the CPU reference's matmul on the same shapes (f32 weights: it dequantises at load)
  for (const n of [1, batch]) {
    const xs = random(n * k, 7);
    const y = new Float32Array(n * rows);
    cpuMatmul(y, xs, values, n, k, rows); // warm
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) cpuMatmul(y, xs, values, n, k, rows);
    const ms = (performance.now() - t0) / reps;
    figures.push({ kernel: 'cpu_reference_matmul_f32', shape: `[${rows}×${k}]·[${k}${n > 1 ? `×${n}` : ''}]`, ms, gb_s: (k * rows * 4 + n * k * 4) / ms / 1e6, gflop_s: (2 * k * rows * n) / ms / 1e6 });
  }
  // attention over an attnCtx-position cache: 32 heads of 128, 8 KV heads
  const shape = { nHead: 32, nHeadKv: 8, headDim: 128 };
  const ctx = attnCtx;
  const kv = ctx * shape.nHeadKv * shape.headDim;
  const kc = memory.upload('k', random(kv, 3));
  const vc = memory.upload('v', random(kv, 4));
  const q = memory.upload('q', random(batch * shape.nHead * shape.headDim, 5));
  const att = storage(batch * shape.nHead * shape.headDim);
  const partial = storage(op.attentionPartialElements(shape, ctx));
  const kvBytes = 2 * kv * 4;
  let ms = await timeKernel(device, lib, res, (rec) => op.attentionDecode(rec, shape, q, 0, kc, vc, partial, att, ctx), reps);
  figures.push({ kernel: 'attention_decode', shape: `32 heads × 128, GQA 8, ${ctx} positions`, ms, gb_s: kvBytes / ms / 1e6, gflop_s: (4 * shape.nHead * shape.headDim * ctx) / ms / 1e6 });
  ms = await timeKernel(device, lib, res, (rec) => op.attentionPrefill(rec, shape, q, kc, vc, att, attnQueries, ctx - attnQueries), reps);
  figures.push({ kernel: 'attention_prefill', shape: `${attnQueries} queries, 32 heads × 128, GQA 8, ≤${ctx} positions`, ms, gb_s: kvBytes / ms / 1e6, gflop_s: (4 * shape.nHead * shape.headDim * ctx * attnQueries) / ms / 1e6 });
  const normW = memory.upload('nw', random(k, 6));
  ms = await timeKernel(device, lib, res, (rec) => op.rmsNorm(rec, x, 0, k, normW, out, 0, k, k, batch, 1e-5), reps);
  figures.push({ kernel: 'rms_norm', shape: `${batch}×${k}`, ms, gb_s: (2 * batch * k * 4) / ms / 1e6, gflop_s: (3 * batch * k) / ms / 1e6 });
  res.dispose();
  memory.destroyAll();
  device.destroy();
  return { adapter, kernels: figures };
}

interface EngineFigure {
  backend: string;
  prefill_tokens: number;
  prefill_ms: number;
  prefill_tok_s: number;
  decode_tokens: number;
  decode_ms: number;
  decode_tok_s: number;
  tokens: number[];
}

async function engineFigure(name: string, stage: StageBackend, path: string, nLayer: number, prompt: number[], nDecode: number): Promise<EngineFigure> {
  const source = await openTensorSource(path);
  try {
    await stage.load(source, { start: 0, end: nLayer });
    await stage.openSession('bench', { contextLength: prompt.length + nDecode + 8 });
    let t0 = performance.now();
    let out = (await stage.forward('bench', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
    const prefillMs = performance.now() - t0;
    const tokens: number[] = [];
    t0 = performance.now();
    for (let i = 0; i < nDecode; i++) {
      if (out.kind !== 'logits') throw new Error('expected logits');
      tokens.push(argmax(out.logits));
      out = (await stage.forward('bench', { kind: 'tokens', tokens: Int32Array.from([tokens.at(-1)!]) }, prompt.length + i)).output;
    }
    const decodeMs = performance.now() - t0;
    return {
      backend: name,
      prefill_tokens: prompt.length,
      prefill_ms: prefillMs,
      prefill_tok_s: (prompt.length / prefillMs) * 1000,
      decode_tokens: nDecode,
      decode_ms: decodeMs,
      decode_tok_s: (nDecode / decodeMs) * 1000,
      tokens,
    };
  } finally {
    await stage.dispose();
    await source.close();
  }
}

export async function run(args: string[]): Promise<unknown> {
  const type = option(args, 'type', 'q4_k_m') as ModelType;
  const layers = Number(option(args, 'layers', '4'));
  const arch = option(args, 'arch', 'llama') as SyntheticArch;
  const moeArch = arch === 'qwen2moe' || arch === 'qwen3moe';
  const model: MakeModelOptions = {
    arch,
    type,
    layers,
    ...(moeArch
      ? { experts: Number(option(args, 'experts', '8')), expertsUsed: Number(option(args, 'experts-used', '2')), expertFfn: Number(option(args, 'expert-ffn', '512')) }
      : {}),
    embd: Number(option(args, 'embd', '512')),
    ffn: Number(option(args, 'ffn', '1536')),
    heads: Number(option(args, 'heads', '8')),
    kvHeads: Number(option(args, 'kv-heads', '4')),
    vocab: Number(option(args, 'vocab', '2048')),
    seed: 1,
  };
  const nPrompt = Number(option(args, 'prompt', '64'));
  const nDecode = Number(option(args, 'decode', '16'));
  const backends = option(args, 'backends', 'webgpu,cpu,llamacpp').split(',');
  const kernelK = Number(option(args, 'kernel-k', '1024'));
  const kernelRows = Number(option(args, 'kernel-rows', '1024'));
  const attnCtx = Number(option(args, 'attn-ctx', '512'));
  const attnQueries = Number(option(args, 'attn-queries', '16'));

  const types = kernelTypes(model, option(args, 'kernel-types', ''));
  const { adapter, kernels } = await kernelFigures(kernelK, kernelRows, attnCtx, attnQueries, Number(option(args, 'reps', '3')), types);
  const path = await syntheticModel(model);
  const vocab = model.vocab!;
  const prompt = Array.from({ length: nPrompt }, (_, i) => (i === 0 ? 1 : 3 + ((i * 131) % (vocab - 3))));
  const engines: EngineFigure[] = [];
  for (const b of backends) {
    const stage: StageBackend = b === 'webgpu' ? await createNodeWebGpuBackend() : b === 'cpu' ? new CpuBackend() : new LlamaCppStage({ kvType: 'f32', flashAttention: false });
    engines.push(await engineFigure(b, stage, path, layers, prompt, nDecode));
  }
  const by = (name: string) => engines.find((e) => e.backend === name);
  const gpu = by('webgpu');
  return {
    adapter,
    note: (adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter
      ? 'software adapter (SwiftShader): a correctness vehicle, not a speed target'
      : 'hardware adapter',
    model: { ...model, path },
    kernels,
    engines,
    ...(moeArch ? { moe_decode: await moeDecodeBytes(path, prompt, nDecode) } : {}),
    ratios: {
      decode_webgpu_over_cpu: gpu && by('cpu') ? gpu.decode_tok_s / by('cpu')!.decode_tok_s : null,
      decode_webgpu_over_llamacpp: gpu && by('llamacpp') ? gpu.decode_tok_s / by('llamacpp')!.decode_tok_s : null,
      prefill_webgpu_over_cpu: gpu && by('cpu') ? gpu.prefill_tok_s / by('cpu')!.prefill_tok_s : null,
      prefill_webgpu_over_llamacpp: gpu && by('llamacpp') ? gpu.prefill_tok_s / by('llamacpp')!.prefill_tok_s : null,
      tokens_agree: engines.every((e) => JSON.stringify(e.tokens) === JSON.stringify(engines[0]!.tokens)),
    },
  };
}
