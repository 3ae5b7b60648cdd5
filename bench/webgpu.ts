// `npm run bench -- webgpu [--gpu] [--type q4_k_m] [--layers 4] [--embd 512] [--ffn 1536]
//   [--heads 8] [--kv-heads 4] [--vocab 2048] [--prompt 64] [--decode 16] [--kernel-k 1024]
//   [--kernel-rows 1024] [--attn-ctx 512] [--attn-queries 16] [--copy-mb 64] [--inner 8]
//   [--reps 3] [--contexts 16,256] [--backends webgpu,cpu,llamacpp] [--arch llama]
//   [--kernel-types f32,q5_k,…] [--experts 8] [--experts-used 2] [--expert-ffn 512]
//   [--batch-rows 1,8,32] [--batch-rounds 3] [--only-batch]`
//
// Kernels are timed for the six original weight types plus those --type's model holds (or the
// --kernel-types list). With a MoE --arch (qwen3moe, qwen2moe) the JSON also says how many
// weight bytes one decoded token reads — by the kernels' own accounting — beside the audit's
// active bytes per token and the model's total.
//
// On a real GPU, run the GPU-sized preset (one command, Dawn through the `webgpu` package and
// the system's Vulkan driver):
//
//     npm run bench -- webgpu --gpu
//
// (= --kernel-k 4096 --kernel-rows 14336 --attn-ctx 4096 --attn-queries 64 --copy-mb 1024
//  --inner 50 --reps 5, an 8 × 2048 Q4_K_M model, contexts 16,256,1024,2048). The defaults are
// sized so the run stays near a few minutes on SwiftShader, which is what a machine without a
// GPU has: a CPU emulating a GPU (barriers are very slow there), so its figures check that
// things run, not speed.
//
// WebGPU (Dawn in this process) against the CPU engine and llama.cpp in the same run: per-kernel
// GB/s against a plain copy kernel's GB/s on the same adapter (bench/lib/webgpu-kernels.ts),
// then prefill and decode tok/s of a synthetic model, and the decode step time at several
// contexts; then batched decode on the WebGPU stage (bench/lib/webgpu-batch.ts: ms of a step
// alone against ms per row of one forwardBatch of 1, 8 and 32 sessions' steps, each batch's rows
// checked bit for bit against twin sessions decoded alone; --only-batch runs just that section).
// Goal, on a hardware adapter: Q4_K mat-vec at 4096 × 14336 ≥ 70 % of the copy
// kernel's GB/s (on a software adapter it is reported, not checked).

import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { createNodeWebGpuBackend } from '../src/backends/webgpu/node.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { argmax } from '../src/model/sampler.ts';
import type { MakeModelOptions, ModelType, SyntheticArch } from '../src/model/synthetic-model.ts';
import { syntheticModel } from '../test/support/synthetic.ts';
import { finishLoad, goal, machineLoad, round2, skippedGoal } from './lib/goals.ts';
import type { Goal } from './lib/goals.ts';
import { batchedDecode } from './lib/webgpu-batch.ts';
import { kernelFigures } from './lib/webgpu-kernels.ts';
import { kernelTypes, moeDecodeBytes } from './lib/webgpu-moe.ts';

function option(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1]! : fallback;
}

/** the GPU-sized preset of --gpu (each still overridable) */
const GPU_PRESET: Record<string, string> = {
  'kernel-k': '4096', 'kernel-rows': '14336', 'attn-ctx': '4096', 'attn-queries': '64', 'copy-mb': '1024', inner: '50', reps: '5',
  layers: '8', embd: '2048', ffn: '5632', heads: '16', 'kv-heads': '4', vocab: '32000', prompt: '256', decode: '32', contexts: '16,256,1024,2048',
};

interface EngineFigure {
  backend: string;
  prefill_tokens: number;
  prefill_ms: number;
  prefill_tok_s: number;
  decode_tokens: number;
  decode_ms: number;
  decode_tok_s: number;
  tokens: number[];
  decode_step_ms: Record<string, number>;
}

/** ms of a decode step after `ctx` positions, best of 3 rounds of 4 steps */
async function stepAt(stage: StageBackend, ctx: number, vocab: number): Promise<number> {
  await stage.openSession('ctx', { contextLength: ctx + 16 });
  try {
    const p = Int32Array.from({ length: ctx }, (_, i) => 1 + ((i * 37) % (vocab - 1)));
    for (let at = 0; at < ctx; at += 256) await stage.forward('ctx', { kind: 'tokens', tokens: p.subarray(at, at + 256) }, at);
    let pos = ctx;
    const times: number[] = [];
    for (let r = 0; r < 3; r++) {
      const t0 = performance.now();
      for (let i = 0; i < 4; i++) await stage.forward('ctx', { kind: 'tokens', tokens: Int32Array.of(7) }, pos++);
      times.push((performance.now() - t0) / 4);
    }
    return Math.min(...times);
  } finally {
    await stage.releaseSession('ctx');
  }
}

async function engineFigure(name: string, stage: StageBackend, path: string, nLayer: number, prompt: number[], nDecode: number, contexts: number[], vocab: number): Promise<EngineFigure> {
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
    await stage.releaseSession('bench');
    const steps: Record<string, number> = {};
    for (const c of contexts) steps[`context_${c}`] = round2(await stepAt(stage, c, vocab));
    return {
      backend: name,
      prefill_tokens: prompt.length,
      prefill_ms: prefillMs,
      prefill_tok_s: (prompt.length / prefillMs) * 1000,
      decode_tokens: nDecode,
      decode_ms: decodeMs,
      decode_tok_s: (nDecode / decodeMs) * 1000,
      tokens,
      decode_step_ms: steps,
    };
  } finally {
    await stage.dispose();
    await source.close();
  }
}

export async function run(args: string[]): Promise<unknown> {
  const gpu = args.includes('--gpu');
  const opt = (name: string, fallback: string) => option(args, name, gpu ? (GPU_PRESET[name] ?? fallback) : fallback);
  const load = machineLoad();
  const type = opt('type', 'q4_k_m') as ModelType;
  const layers = Number(opt('layers', '4'));
  const arch = opt('arch', 'llama') as SyntheticArch;
  const moeArch = arch === 'qwen2moe' || arch === 'qwen3moe';
  const model: MakeModelOptions & { vocab: number } = {
    arch,
    type,
    layers,
    ...(moeArch ? { experts: Number(opt('experts', '8')), expertsUsed: Number(opt('experts-used', '2')), expertFfn: Number(opt('expert-ffn', '512')) } : {}),
    embd: Number(opt('embd', '512')),
    ffn: Number(opt('ffn', '1536')),
    heads: Number(opt('heads', '8')),
    kvHeads: Number(opt('kv-heads', '4')),
    vocab: Number(opt('vocab', '2048')),
    seed: 1,
  };
  const nPrompt = Number(opt('prompt', '64'));
  const nDecode = Number(opt('decode', '16'));
  const backends = opt('backends', 'webgpu,cpu,llamacpp').split(',');
  const contexts = opt('contexts', '16,256').split(',').map(Number);
  const shapes = {
    k: Number(opt('kernel-k', '1024')),
    rows: Number(opt('kernel-rows', '1024')),
    attnCtx: Number(opt('attn-ctx', '512')),
    attnQueries: Number(opt('attn-queries', '16')),
    copyBytes: Number(opt('copy-mb', '64')) << 20,
    inner: Number(opt('inner', '8')),
    reps: Number(opt('reps', '3')),
  };

  const path = await syntheticModel(model);
  const batchRows = opt('batch-rows', '1,8,32').split(',').map(Number);
  const batched = () => batchedDecode(path, layers, model.vocab, batchRows, Number(opt('batch-rounds', '3')));
  if (args.includes('--only-batch')) {
    const batchedDecode = await batched();
    return { machine: finishLoad(load), model: { ...model, path }, batched_decode: batchedDecode };
  }
  const { adapter, kernels } = await kernelFigures(shapes, kernelTypes(model, opt('kernel-types', '')));
  const prompt = Array.from({ length: nPrompt }, (_, i) => (i === 0 ? 1 : 3 + ((i * 131) % (model.vocab - 3))));
  const engines: EngineFigure[] = [];
  for (const b of backends) {
    const stage: StageBackend = b === 'webgpu' ? await createNodeWebGpuBackend() : b === 'cpu' ? createNodeCpuBackend() : new LlamaCppStage({ kvType: 'f32', flashAttention: false });
    engines.push(await engineFigure(b, stage, path, layers, prompt, nDecode, contexts, model.vocab));
  }
  const by = (name: string) => engines.find((e) => e.backend === name);
  const ratio = (a: string, b: string, f: 'decode_tok_s' | 'prefill_tok_s') => (by(a) && by(b) ? round2(by(a)![f] / by(b)![f]) : null);
  const software = adapter.isFallbackAdapter || /swiftshader/i.test(adapter.architecture);
  const q4k = kernels.find((k) => k.kernel === 'mul_mat_vec_q4_k')!;
  const figure = `mul_mat_vec_q4_k GB/s at ${shapes.rows} × ${shapes.k} / copy kernel GB/s`;
  const goals: Goal[] = [
    software || shapes.k !== 4096 || shapes.rows !== 14336
      ? skippedGoal(figure, q4k.of_copy ?? NaN, 'min', 0.7, software ? `software adapter (${adapter.architecture || 'fallback'}): run on a real GPU with --gpu` : 'needs the 4096 × 14336 shape (--gpu)')
      : goal(figure, q4k.of_copy ?? NaN, 'min', 0.7),
  ];
  return {
    adapter,
    note: software ? `software adapter (${adapter.architecture || 'fallback'}, SwiftShader): a correctness vehicle, not a speed target` : 'hardware adapter',
    preset: gpu ? 'gpu' : 'default (sized for SwiftShader)',
    machine: finishLoad(load),
    model: { ...model, path },
    kernels: kernels.map((k) => ({ ...k, ms: round2(k.ms * 1000) / 1000, gb_s: round2(k.gb_s), gflop_s: round2(k.gflop_s) })),
    engines,
    ...(moeArch ? { moe_decode: await moeDecodeBytes(path, prompt, nDecode) } : { batched_decode: await batched() }),
    ratios: {
      decode_webgpu_over_cpu: ratio('webgpu', 'cpu', 'decode_tok_s'),
      decode_webgpu_over_llamacpp: ratio('webgpu', 'llamacpp', 'decode_tok_s'),
      prefill_webgpu_over_cpu: ratio('webgpu', 'cpu', 'prefill_tok_s'),
      prefill_webgpu_over_llamacpp: ratio('webgpu', 'llamacpp', 'prefill_tok_s'),
      tokens_agree: engines.every((e) => JSON.stringify(e.tokens) === JSON.stringify(engines[0]!.tokens)),
    },
    goals,
  };
}
