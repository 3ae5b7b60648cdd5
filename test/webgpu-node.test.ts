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
import { syntheticModel } from './support/synthetic.ts';
import { ForwardPass } from '../src/backends/webgpu/forward-pass.ts';
import { MeshError } from '../src/errors.ts';

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

  it('a pass that fails after its session\'s cache grew leaves the session as it was: no buffer left behind, and the retry gives the bits of a session that never failed', async () => {
    const tiny = await openTensorSource(await syntheticModel({ layers: 1, embd: 64, ffn: 128, heads: 2, vocab: 384, seed: 3 }));
    const b = await createNodeWebGpuBackend();
    try {
      await b.load(tiny, { start: 0, end: 1 });
      const prompt = Int32Array.from({ length: 250 }, (_, i) => 1 + ((i * 7) % 383));
      const tail = { kind: 'tokens' as const, tokens: Int32Array.from({ length: 10 }, (_, i) => 1 + ((i * 5) % 383)) };
      for (const s of ['kept', 'hurt']) {
        await b.openSession(s, { contextLength: 512 });
        await b.forward(s, { kind: 'tokens', tokens: prompt }, 0);
      }
      const before = await b.bufferStats();
      // positions 250-259 need more than the first 256: the cache grows in this pass, which then fails on the GPU's side
      const pass = ForwardPass.prototype as unknown as { finish: (...a: unknown[]) => Promise<unknown> };
      const finish = pass.finish;
      pass.finish = async () => {
        throw new MeshError('WEBGPU_ERROR', 'injected: the device lost the submission');
      };
      try {
        await expect(b.forward('hurt', tail, 250)).rejects.toThrow(/injected/);
      } finally {
        pass.finish = finish;
      }
      // the grown cache's buffers are freed (its 2 × 256 more positions); the pass's scratch for 260 positions stays, for the retry
      const after = await b.bufferStats();
      expect(after.count).toBe(before.count);
      expect(after.bytes - before.bytes).toBeLessThan(4096);
      const retried = await b.forward('hurt', tail, 250);
      const reference = await b.forward('kept', tail, 250);
      expect(retried.output.kind === 'logits' && Array.from(retried.output.logits)).toEqual(reference.output.kind === 'logits' && Array.from(reference.output.logits));
    } finally {
      await b.dispose();
      await tiny.close();
    }
  }, 120_000);

  it('dispose frees every GPU buffer', async () => {
    const b = await createNodeWebGpuBackend();
    await b.load(source, { start: 2, end: 5 });
    await b.openSession('x', { contextLength: 8 });
    expect((await b.bufferStats()).count).toBeGreaterThan(0);
    await b.dispose();
    expect(await b.bufferStats()).toEqual({ count: 0, bytes: 0 });
  });
});
