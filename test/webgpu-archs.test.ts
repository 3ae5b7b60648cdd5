// The WebGPU stage on Dawn (SwiftShader here) against llama.cpp on the architectures and rope
// variants of test/support/arch-cases.ts, alone and as the second stage of a 2-stage route whose
// first stage is the CPU reference ([0, 1) on CPU, [1, 2) on WebGPU, hidden states in f32):
// F32 greedy-identical with logits within the case's tolerance, Q4_K_M by the quantised rule of
// test/support/oracle-check.ts. MoE decode also goes through the gather-by-expert mat-vec
// (mul_mat_vec_id) that hardware adapters use, forced here.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { createNodeWebGpuBackend } from '../src/backends/webgpu/node.ts';
import type { WebGpuStageOptions } from '../src/backends/webgpu/stage.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { ARCH_CASES, NEW_ARCHS, PROMPT, QUANT_MIX } from './support/arch-cases.ts';
import { LlamaModelFfi } from './support/llamacpp-oracle.ts';
import { expectGreedyMatchesOracle } from './support/oracle-check.ts';
import { syntheticModel } from './support/synthetic.ts';

const N = 12;
const open: TensorSource[] = [];
afterAll(async () => {
  for (const s of open) await s.close();
});

type Route = 'webgpu' | 'cpu+webgpu';

async function check(label: string, options: MakeModelOptions, route: Route, exact: boolean, tolerance: number, gpuOptions: WebGpuStageOptions = {}): Promise<void> {
  const path = await syntheticModel(options);
  const oracle = await LlamaModelFfi.load(path);
  const source = await openTensorSource(path);
  open.push(source);
  const { nLayer } = configFromHeader(source.header);
  const stages: StageBackend[] = [];
  if (route === 'cpu+webgpu') {
    const first = new CpuBackend();
    await first.load(source, { start: 0, end: 1 });
    stages.push(first);
  }
  const gpu = await createNodeWebGpuBackend(gpuOptions);
  await gpu.load(source, { start: route === 'cpu+webgpu' ? 1 : 0, end: nLayer });
  stages.push(gpu);
  const chain = new InProcessChain(stages);
  try {
    await expectGreedyMatchesOracle(`${route} ${label}`, chain, oracle, oracle.tokenize(PROMPT), N, { exact, tolerance });
  } finally {
    await chain.dispose();
    oracle.dispose();
  }
}

describe.each(['webgpu', 'cpu+webgpu'] as const)('%s route against llama.cpp', (route) => {
  it.each(ARCH_CASES)('$label, F32: greedy tokens identical, logits agree', async ({ label, options, tolerance }) => {
    // GPU exp/sum orders add a little to the f32 error budget
    await check(label, options, route, true, 4 * tolerance);
  });

  it.each(NEW_ARCHS)(`%s, ${QUANT_MIX}: greedy tokens agree`, async (arch) => {
    const c = ARCH_CASES.find((x) => x.options.arch === arch)!;
    await check(`${c.label} ${QUANT_MIX}`, { ...c.options, type: QUANT_MIX }, route, false, 0);
  });
});

describe('MoE decode through the gather-by-expert mat-vec', () => {
  it('qwen3moe with the hardware kernels (mul_mat_vec_id for one token, mul_mat_tiled): greedy identical', async () => {
    const c = ARCH_CASES.find((x) => x.options.arch === 'qwen3moe')!;
    await check(`${c.label} (mat-vec kernels)`, c.options, 'webgpu', true, 4 * c.tolerance, { matVec: 'mul_mat_vec', matMul: 'mul_mat_tiled' });
  });
});

describe('tensors and caches larger than one storage binding', () => {
  it('qwen3moe with every expert in its own buffer and each layer\'s KV cache split by heads: greedy identical', async () => {
    const c = ARCH_CASES.find((x) => x.options.arch === 'qwen3moe')!;
    // 256 × 256 f32 = 256 KiB per expert; a KV part of 64 positions × 1 head × 64 dims f32 = 16 KiB
    const limits = { maxChunkBytes: 256 * 1024, maxKvBindingBytes: 64 * 64 * 4 };
    await check(`${c.label} (split experts and KV)`, c.options, 'webgpu', true, 4 * c.tolerance, limits);
    await check(`${c.label} (split experts and KV, f16 cache)`, c.options, 'webgpu', false, 0, { ...limits, kvType: 'f16' });
  });

  it('a split KV cache takes one buffer per head group; one head past the limit is CONTEXT_TOO_LARGE', async () => {
    const source = await openTensorSource(await syntheticModel(ARCH_CASES[0]!.options));
    open.push(source);
    const buffersFor = async (maxKvBindingBytes?: number) => {
      const gpu = await createNodeWebGpuBackend(maxKvBindingBytes ? { maxKvBindingBytes } : {});
      await gpu.load(source, { start: 0, end: 2 });
      const before = (await gpu.bufferStats()).count;
      await gpu.openSession('s', { contextLength: 64 });
      const count = (await gpu.bufferStats()).count - before;
      await gpu.dispose();
      return count;
    };
    // 2 layers × (k, v): unsplit 4 buffers, split into the 2 KV heads 8
    expect(await buffersFor()).toBe(4);
    expect(await buffersFor(64 * 64 * 4)).toBe(8);
    const gpu = await createNodeWebGpuBackend({ maxKvBindingBytes: 64 * 64 * 4 });
    await gpu.load(source, { start: 0, end: 2 });
    await expect(gpu.openSession('long', { contextLength: 512 })).rejects.toMatchObject({ code: 'CONTEXT_TOO_LARGE' });
    await gpu.dispose();
  });
});
