// Qwen3.5 (qwen35moe, qwen35) on the WebGPU stage (Dawn, SwiftShader here) against llama.cpp on
// synthetic models: alone, as the second stage after the CPU reference, and on a prompt of
// several 32-token chunks split over two WebGPU stages; then the session's recurrent state on
// the GPU: logits equal to the CPU reference's however tokens are batched, the CPU engine's
// rewind rules (within the chunk, to the checkpoint of a forward that crossed a chunk end, to
// 0, POSITION_MISMATCH elsewhere), and its memory accounting and release.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { CHUNK, deltaLayerBytes } from '../src/backends/cpu/delta-chunk.ts';
import type { StageBackend, StageOutput } from '../src/backends/types.ts';
import type { WebGpuBackend } from '../src/backends/webgpu/backend.ts';
import { createNodeWebGpuBackend } from '../src/backends/webgpu/node.ts';
import type { WebGpuStageOptions } from '../src/backends/webgpu/stage.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { PROMPT } from './support/arch-cases.ts';
import { LlamaModelFfi, maxAbsDiff } from './support/llamacpp-oracle.ts';
import { expectGreedyMatchesOracle } from './support/oracle-check.ts';
import { syntheticModel } from './support/synthetic.ts';

/** as test/cpu-qwen35.test.ts: DeltaNet 0-2 (2 q/k, 4 v heads of 32), full attention on 3 (4 heads / 2 KV of 64, 16 rotated dims) */
const SHAPE: MakeModelOptions = { layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512, linearKHeads: 2, linearVHeads: 4, linearHeadDim: 32 };
const MOE: MakeModelOptions = { ...SHAPE, arch: 'qwen35moe', expertFfn: 256, sharedFfn: 256 };
const DENSE: MakeModelOptions = { ...SHAPE, arch: 'qwen35' };
const LONG_PROMPT = Array.from({ length: 6 }, () => PROMPT).join(' ');

const open: TensorSource[] = [];
afterAll(async () => {
  for (const s of open) await s.close();
});

async function source(path: string): Promise<TensorSource> {
  const s = await openTensorSource(path);
  open.push(s);
  return s;
}

async function gpuStage(path: string, start = 0, end?: number, options: WebGpuStageOptions = {}): Promise<WebGpuBackend> {
  const s = await source(path);
  const b = await createNodeWebGpuBackend(options);
  await b.load(s, { start, end: end ?? configFromHeader(s.header).nLayer });
  return b;
}

async function cpuStage(path: string, start = 0, end?: number): Promise<StageBackend> {
  const s = await source(path);
  const b = new CpuBackend();
  await b.load(s, { start, end: end ?? configFromHeader(s.header).nLayer });
  return b;
}

function logits(o: StageOutput): Float32Array {
  if (o.kind !== 'logits') throw new Error('expected logits');
  return o.logits;
}

describe('qwen35 / qwen35moe on WebGPU against llama.cpp', () => {
  it.each([
    ['qwen35moe F32, WebGPU alone', MOE, false],
    ['qwen35 F32, WebGPU alone', DENSE, false],
    ['qwen35moe F32, CPU [0, 1) + WebGPU [1, 4)', MOE, true],
    ['qwen35moe Q8_0, WebGPU alone', { ...MOE, type: 'q8_0' }, false],
    // the kernels hardware adapters take: workgroup-reduced mat-vec, gather-by-expert decode, tiled prefill
    ['qwen35moe F32, WebGPU alone with the hardware kernels', MOE, false, { matVec: 'mul_mat_vec', matMul: 'mul_mat_tiled' }],
  ] as const)('%s: greedy 12 tokens', async (label, options, cpuFirst, gpuOptions: WebGpuStageOptions = {}) => {
    const path = await syntheticModel(options);
    const oracle = await LlamaModelFfi.load(path);
    const stages = cpuFirst ? [await cpuStage(path, 0, 1), await gpuStage(path, 1)] : [await gpuStage(path, 0, undefined, gpuOptions)];
    const chain = new InProcessChain(stages);
    try {
      const exact = !('type' in options);
      await expectGreedyMatchesOracle(`webgpu ${label}`, chain, oracle, oracle.tokenize(PROMPT), 12, { exact, tolerance: 4e-4 });
    } finally {
      await chain.dispose();
      oracle.dispose();
    }
  });

  it(`a prompt of several ${CHUNK}-token chunks over two WebGPU stages [0, 2) + [2, 4): llama.cpp's tokens`, async () => {
    const path = await syntheticModel(MOE);
    const oracle = await LlamaModelFfi.load(path);
    const chain = new InProcessChain([await gpuStage(path, 0, 2), await gpuStage(path, 2, 4)]);
    try {
      const prompt = oracle.tokenize(LONG_PROMPT);
      expect(prompt.length).toBeGreaterThan(2 * CHUNK);
      const r = await expectGreedyMatchesOracle('webgpu qwen35moe split, long prompt', chain, oracle, prompt, 8, { exact: true, tolerance: 4e-4 });
      expect(r.firstDiff).toBe(-1);
    } finally {
      await chain.dispose();
      oracle.dispose();
    }
  });
});

describe('recurrent state of a WebGPU session', () => {
  it('batching does not change the logits, which are the CPU reference\'s; rewinds follow the CPU engine\'s rules', async () => {
    const path = await syntheticModel(MOE);
    const gpu = await gpuStage(path);
    const cpu = await cpuStage(path);
    const tokens = Int32Array.from({ length: 2 * CHUNK + 7 }, (_, i) => (i * 37 + 11) % 1000);
    const n = tokens.length;
    await gpu.openSession('whole', { contextLength: 128 });
    const whole = logits((await gpu.forward('whole', { kind: 'tokens', tokens }, 0)).output);
    await cpu.openSession('cpu', { contextLength: 128 });
    const ref = logits((await cpu.forward('cpu', { kind: 'tokens', tokens }, 0)).output);
    console.log(`webgpu qwen35moe ${n}-token prefill vs CPU reference: max |logit diff| ${maxAbsDiff(whole, ref).toExponential(2)}`);
    expect(maxAbsDiff(whole, ref)).toBeLessThan(1e-3);
    // prefill 29, then one token at a time across the chunk ends at 32 and 64
    await gpu.openSession('steps', { contextLength: 128 });
    let last = logits((await gpu.forward('steps', { kind: 'tokens', tokens: tokens.subarray(0, 29) }, 0)).output);
    for (let p = 29; p < n; p++) last = logits((await gpu.forward('steps', { kind: 'tokens', tokens: tokens.subarray(p, p + 1) }, p)).output);
    expect(maxAbsDiff(last, whole)).toBeLessThan(1e-5);

    // within the current chunk (64..71): drop 3 rows and recompute them
    await gpu.truncateSession('steps', n - 3);
    last = logits((await gpu.forward('steps', { kind: 'tokens', tokens: tokens.subarray(n - 3) }, n - 3)).output);
    expect(maxAbsDiff(last, whole)).toBeLessThan(1e-5);
    // to the start of a forward that crossed the chunk end at 64 (its checkpoint)
    await gpu.truncateSession('steps', 60);
    await gpu.truncateSession('steps', 60); // idempotent
    last = logits((await gpu.forward('steps', { kind: 'tokens', tokens: tokens.subarray(60) }, 60)).output);
    expect(maxAbsDiff(last, whole)).toBeLessThan(1e-5);
    // further back than the checkpoint: POSITION_MISMATCH, and the session is unchanged
    await expect(gpu.truncateSession('steps', 20)).rejects.toMatchObject({ code: 'POSITION_MISMATCH' });
    expect((await gpu.sessionStats('steps')).position).toBe(n);
    // to 0: the state is cleared, a replay gives the same logits
    await gpu.truncateSession('steps', 0);
    last = logits((await gpu.forward('steps', { kind: 'tokens', tokens }, 0)).output);
    expect(maxAbsDiff(last, whole)).toBeLessThan(1e-5);

    // accounting: 3 DeltaNet layers of state (+ the checkpoint of the last chunk-crossing forward), KV only on the attention layer
    const c = configFromHeader((await source(path)).header);
    const stats = await gpu.sessionStats('steps');
    const layer = deltaLayerBytes(c.linearAttention!) - 4 * CHUNK * c.linearAttention!.nVHeads; // the decays are f32 here, f64 on the CPU
    expect(stats.recurrentBytes).toBe(2 * 3 * layer);
    expect(stats.kvBytes).toBe(2 * 1 * 128 * c.nHeadKv * c.headDim * 4);
    // close: the session's K/V buffers (the attention layer's k and v) and 5 state buffers per DeltaNet layer, twice with the checkpoint
    const before = (await gpu.bufferStats()).count;
    await gpu.releaseSession('steps');
    expect(before - (await gpu.bufferStats()).count).toBe(2 + 2 * 3 * 5);
    await gpu.releaseSession('whole');
    await gpu.dispose();
    await cpu.dispose();
  }, 300_000);
});
