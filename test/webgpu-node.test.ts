// The WebGPU stage in Node on Dawn (the `webgpu` package, SwiftShader here): the path behind
// `gguf-mesh generate --backend webgpu` and the benchmark. Same checks as the browser chain.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { argmax } from '../src/backends/cpu/ops.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { createNodeWebGpuBackend } from '../src/backends/webgpu/node.ts';
import type { WebGpuBackend } from '../src/backends/webgpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';

let source: TensorSource;
let cpu: CpuBackend;
let gpu: WebGpuBackend;

beforeAll(async () => {
  source = await openTensorSource(await stories260K());
  cpu = new CpuBackend();
  await cpu.load(source, { start: 0, end: 5 });
  gpu = await createNodeWebGpuBackend();
  await gpu.load(source, { start: 0, end: 5 });
});

afterAll(async () => {
  await cpu?.dispose();
  await gpu?.dispose();
  await source?.close();
});

async function greedy(stage: StageBackend, n: number): Promise<{ tokens: number[]; logits: Float32Array }> {
  await stage.openSession('g', { contextLength: 64 });
  let pos = 0;
  let input = Int32Array.from(STORIES_PROMPT_TOKENS);
  const tokens: number[] = [];
  let logits = new Float32Array();
  for (let i = 0; i < n; i++) {
    const out = (await stage.forward('g', { kind: 'tokens', tokens: input }, pos)).output;
    if (out.kind !== 'logits') throw new Error('expected logits');
    logits = out.logits as Float32Array<ArrayBuffer>;
    pos += input.length;
    tokens.push(argmax(logits));
    input = Int32Array.from([tokens.at(-1)!]);
  }
  await stage.releaseSession('g');
  return { tokens, logits };
}

describe('WebGPU stage on Dawn in Node', () => {
  it('reports the adapter it runs on', () => {
    expect(gpu.adapter.architecture.length + gpu.adapter.vendor.length).toBeGreaterThan(0);
    expect(gpu.adapter.maxStorageBufferBindingSize).toBeGreaterThan(0);
  });

  it('stories260K greedy 32 tokens equal the CPU reference; last logits within 1e-3', async () => {
    const want = await greedy(cpu, 32);
    const got = await greedy(gpu, 32);
    expect(got.tokens).toEqual(want.tokens);
    let maxDiff = 0;
    let maxRef = 0;
    want.logits.forEach((v, i) => {
      maxDiff = Math.max(maxDiff, Math.abs(got.logits[i]! - v));
      maxRef = Math.max(maxRef, Math.abs(v));
    });
    expect(maxDiff / maxRef).toBeLessThan(1e-3);
  });

  it('dispose frees every GPU buffer', async () => {
    const b = await createNodeWebGpuBackend();
    await b.load(source, { start: 2, end: 5 });
    await b.openSession('x', { contextLength: 8 });
    expect((await b.bufferStats()).count).toBeGreaterThan(0);
    await b.dispose();
    expect(await b.bufferStats()).toEqual({ count: 0, bytes: 0 });
  });
});
