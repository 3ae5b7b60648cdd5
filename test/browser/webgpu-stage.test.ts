// The WebGPU stage end to end in headless Chromium: shards run in dedicated workers (comlink),
// compared with the CPU reference backend on the real stories260K model and on synthetic
// quantised models with grouped-query attention. Models are served by vite from
// .cache/test-models (stories260K linked there by webgpu-global-setup.ts; synthetic ones are
// made here in the page and written there through vitest's file commands).
import { afterAll, describe, expect, it } from 'vitest';
import { commands } from 'vitest/browser';
import { CpuBackend } from '../../src/backends/cpu/backend.ts';
import { argmax } from '../../src/backends/cpu/ops.ts';
import type { StageBackend } from '../../src/backends/types.ts';
import { WebGpuBackend } from '../../src/backends/webgpu/backend.ts';
import { webGpuBackendInWorker } from '../../workers/webgpu-stage.ts';
import { isMeshError } from '../../src/errors.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import { makeModel } from '../../src/model/synthetic-model.ts';
import type { MakeModelOptions } from '../../src/model/synthetic-model.ts';

const SERVED = '.cache/test-models';
const STORIES_PROMPT = [1, 403, 407, 261, 378];
const CONTEXT = 128;

const sources: TensorSource[] = [];
const backends: StageBackend[] = [];

afterAll(async () => {
  for (const b of backends) await b.dispose().catch(() => {});
  for (const s of sources) await s.close();
});

async function served(name: string): Promise<TensorSource> {
  const url = `${location.origin}/${SERVED}/${name}`;
  const head = await fetch(url, { method: 'HEAD' });
  if (!head.ok) throw new Error(`${url} is not served (HTTP ${head.status}): the browser project's globalSetup (test/browser/webgpu-global-setup.ts) links the test models there`);
  const s = await openTensorSource(url);
  sources.push(s);
  return s;
}

async function synthetic(options: MakeModelOptions): Promise<TensorSource> {
  const name = `webgpu-${options.arch ?? 'llama'}-${options.type}-${options.layers}x${options.embd}-kv${options.kvHeads}.gguf`;
  const bytes = makeModel(options);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  await commands.writeFile(`${SERVED}/${name}`, btoa(bin), { encoding: 'base64' });
  return served(name);
}

async function cpuStage(source: TensorSource, start: number, end: number, options = {}): Promise<CpuBackend> {
  const b = new CpuBackend(options);
  await b.load(source, { start, end });
  backends.push(b);
  return b;
}

async function gpuStage(source: TensorSource, start: number, end: number, options = {}): Promise<WebGpuBackend> {
  const b = await webGpuBackendInWorker(options);
  backends.push(b);
  await b.load(source, { start, end });
  return b;
}

/** Runs tokens through a chain of stages; returns the last stage's logits. */
async function chainForward(stages: StageBackend[], session: string, tokens: number[], position: number): Promise<Float32Array> {
  let out = (await stages[0]!.forward(session, { kind: 'tokens', tokens: Int32Array.from(tokens) }, position)).output;
  for (const s of stages.slice(1)) {
    if (out.kind !== 'hidden') throw new Error('a middle stage returned logits');
    out = (await s.forward(session, { kind: 'hidden', hidden: out.hidden, nTokens: out.nTokens }, position)).output;
  }
  if (out.kind !== 'logits') throw new Error('the last stage returned hidden states');
  return out.logits;
}

/** Greedy generation: prefill the prompt in one call, then one token per call. */
async function greedy(stages: StageBackend[], session: string, prompt: number[], nNew: number): Promise<{ tokens: number[]; logits: Float32Array }> {
  for (const s of stages) await s.openSession(session, { contextLength: CONTEXT });
  let logits = await chainForward(stages, session, prompt, 0);
  const tokens: number[] = [];
  for (let i = 0; i < nNew; i++) {
    const next = argmax(logits);
    tokens.push(next);
    if (i === nNew - 1) break;
    logits = await chainForward(stages, session, [next], prompt.length + i);
  }
  for (const s of stages) await s.releaseSession(session);
  return { tokens, logits };
}

function relErr(got: Float32Array, want: Float32Array): number {
  let maxDiff = 0;
  let maxRef = 0;
  for (let i = 0; i < want.length; i++) {
    maxDiff = Math.max(maxDiff, Math.abs(got[i]! - want[i]!));
    maxRef = Math.max(maxRef, Math.abs(want[i]!));
  }
  return Number.isFinite(maxDiff) ? maxDiff / maxRef : Infinity;
}

describe('stories260K', () => {
  it('greedy 32 tokens in one WebGPU worker equal the CPU reference; last logits within 1e-3', async () => {
    const source = await served('stories260K.gguf');
    const n = 5;
    const cpu = await greedy([await cpuStage(source, 0, n)], 'a', STORIES_PROMPT, 32);
    const gpu = await greedy([await gpuStage(source, 0, n)], 'a', STORIES_PROMPT, 32);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(1e-3);
  });

  it('a two-stage chain ([0,2) → [2,5), hidden states between workers) gives the same tokens', async () => {
    const source = await served('stories260K.gguf');
    const cpu = await greedy([await cpuStage(source, 0, 5)], 'b', STORIES_PROMPT, 32);
    const gpu = await greedy([await gpuStage(source, 0, 2), await gpuStage(source, 2, 5)], 'b', STORIES_PROMPT, 32);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(1e-3);
  });

  it('prefill of a 64-token prompt in one forward equals 64 decode steps', async () => {
    const source = await served('stories260K.gguf');
    const gpu = await gpuStage(source, 0, 5);
    const prompt = Array.from({ length: 64 }, (_, i) => (i === 0 ? 1 : 3 + ((i * 37) % 500)));
    await gpu.openSession('batch', { contextLength: CONTEXT });
    await gpu.openSession('steps', { contextLength: CONTEXT });
    const batch = await chainForward([gpu], 'batch', prompt, 0);
    let steps: Float32Array = new Float32Array();
    for (let i = 0; i < prompt.length; i++) steps = await chainForward([gpu], 'steps', [prompt[i]!], i);
    expect(relErr(steps, batch)).toBeLessThan(1e-4);
    expect(argmax(steps)).toBe(argmax(batch));
    expect(gpu.sessionStats('batch')).toEqual(gpu.sessionStats('steps'));
    expect(gpu.sessionStats('batch').position).toBe(64);
    // and both continue identically
    const a = await chainForward([gpu], 'batch', [argmax(batch)], 64);
    const b = await chainForward([gpu], 'steps', [argmax(steps)], 64);
    expect(relErr(b, a)).toBeLessThan(1e-4);
  });

  it('the kernels a hardware adapter gets (workgroup-reduced mat-vec, tiled mat-mat) give the same tokens', async () => {
    const source = await served('stories260K.gguf');
    const cpu = await greedy([await cpuStage(source, 0, 5)], 'h', STORIES_PROMPT, 8);
    const gpu = await greedy([await gpuStage(source, 0, 5, { matVec: 'mul_mat_vec', matMul: 'mul_mat_tiled' })], 'h', STORIES_PROMPT, 8);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(1e-3);
  });

  it('the KV cache grows past 256 positions keeping its contents, and reports what the CPU reference reports', async () => {
    const source = await served('stories260K.gguf');
    const cpu = await cpuStage(source, 0, 5);
    const gpu = await gpuStage(source, 0, 5);
    const prompt = Array.from({ length: 250 }, (_, i) => (i === 0 ? 1 : 3 + ((i * 53) % 500)));
    for (const b of [cpu, gpu]) await b.openSession('long', { contextLength: 600 });
    expect(gpu.sessionStats('long').kvBytes).toBe(cpu.sessionStats('long').kvBytes);
    let want = await chainForward([cpu], 'long', prompt, 0);
    let got = await chainForward([gpu], 'long', prompt, 0);
    for (let i = 0; i < 12; i++) {
      // positions 250..261 cross the first growth (256 → 512)
      expect(argmax(got)).toBe(argmax(want));
      const next = argmax(want);
      want = await chainForward([cpu], 'long', [next], 250 + i);
      got = await chainForward([gpu], 'long', [next], 250 + i);
    }
    expect(relErr(got, want)).toBeLessThan(1e-3);
    expect(gpu.sessionStats('long')).toEqual(cpu.sessionStats('long'));
    expect(gpu.sessionStats('long').kvBytes).toBe(2 * 5 * 512 * 4 * 8 * 4); // 5 layers × 512 positions × 4 KV heads × 8 dims × f32
  });

  it('an f16 KV cache (half the memory) gives the same greedy tokens; logits within 1e-2', async () => {
    const source = await served('stories260K.gguf');
    const cpu = await greedy([await cpuStage(source, 0, 5)], 'f16', STORIES_PROMPT, 32);
    const half = await gpuStage(source, 0, 2, { kvType: 'f16' });
    const gpu = await greedy([half, await gpuStage(source, 2, 5, { kvType: 'f16' })], 'f16', STORIES_PROMPT, 32);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(1e-2);
    await half.openSession('kv', { contextLength: 64 });
    expect(half.sessionStats('kv').kvBytes).toBe(2 * 2 * 64 * 4 * 8 * 2); // 2 layers × 64 positions × 32 dims × f16
  });

  it('weights split over many small buffers give the same logits', async () => {
    const source = await served('stories260K.gguf');
    const whole = await greedy([await gpuStage(source, 0, 5)], 'c', STORIES_PROMPT, 4);
    const split = await greedy([await gpuStage(source, 0, 5, { maxChunkBytes: 4096 })], 'c', STORIES_PROMPT, 4);
    expect(split.tokens).toEqual(whole.tokens);
    expect(relErr(split.logits, whole.logits)).toBeLessThan(1e-5);
  });

  it('a worker that dies fails the call with WEBGPU_WORKER_FAILED instead of hanging', async () => {
    const script = URL.createObjectURL(new Blob(['throw new Error("boom at start");'], { type: 'text/javascript' }));
    const err = await WebGpuBackend.inWorker(new Worker(script, { type: 'module' })).catch((e) => e);
    expect(isMeshError(err, 'WEBGPU_WORKER_FAILED')).toBe(true);
  });

  it('errors keep their codes across the worker boundary, and dispose frees every GPU buffer', async () => {
    const source = await served('stories260K.gguf');
    const gpu = await webGpuBackendInWorker();
    await gpu.load(source, { start: 0, end: 5 });
    await gpu.openSession('s', { contextLength: 16 });
    expect((await gpu.bufferStats()).count).toBeGreaterThan(0);
    const code = async (p: Promise<unknown>) => p.then(() => 'no error', (e) => (isMeshError(e) ? e.code : String(e)));
    expect(await code(gpu.forward('s', { kind: 'tokens', tokens: Int32Array.from([1]) }, 3))).toBe('POSITION_MISMATCH');
    expect(await code(gpu.forward('nope', { kind: 'tokens', tokens: Int32Array.from([1]) }, 0))).toBe('SESSION_UNKNOWN');
    expect(await code(gpu.forward('s', { kind: 'tokens', tokens: Int32Array.from([99999]) }, 0))).toBe('BAD_TOKEN');
    expect(await code(gpu.forward('s', { kind: 'tokens', tokens: new Int32Array(17).fill(1) }, 0))).toBe('CONTEXT_FULL');
    expect(await code(gpu.openSession('s', { contextLength: 16 }))).toBe('SESSION_EXISTS');
    await gpu.forward('s', { kind: 'tokens', tokens: Int32Array.from([1, 2]) }, 0);
    expect(gpu.sessionStats('s').position).toBe(2);
    await gpu.dispose();
    expect(await gpu.bufferStats()).toEqual({ count: 0, bytes: 0 });
  });
});

describe.each(['q8_0', 'q4_0', 'q4_k_m', 'q6_k'] as const)('synthetic %s model with GQA (4 heads, 2 KV heads)', (type) => {
  const options = { type, layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 1024, seed: 3 };
  const prompt = [1, 10, 300, 77, 900, 5];

  it('exact f32 activations: greedy 32 tokens through two WebGPU stages equal the CPU reference; last logits within 1e-3', async () => {
    const source = await synthetic(options);
    const exact = { activationRounding: 'none' } as const;
    const cpu = await greedy([await cpuStage(source, 0, 2, exact)], 's', prompt, 32);
    const gpu = await greedy([await gpuStage(source, 0, 1, exact), await gpuStage(source, 1, 2, exact)], 's', prompt, 32);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(1e-3);
  });

  if (type === 'q4_k_m') {
    it('prefill of 64 tokens in one forward (tiled mat-mat) equals 64 decode steps', async () => {
      const source = await synthetic(options);
      const gpu = await gpuStage(source, 0, 2, { activationRounding: 'none', matVec: 'mul_mat', matMul: 'mul_mat_tiled' });
      const long = Array.from({ length: 64 }, (_, i) => (i * 97 + 1) % 1024);
      await gpu.openSession('batch', { contextLength: CONTEXT });
      await gpu.openSession('steps', { contextLength: CONTEXT });
      const batch = await chainForward([gpu], 'batch', long, 0);
      let steps: Float32Array = new Float32Array();
      for (let i = 0; i < long.length; i++) steps = await chainForward([gpu], 'steps', [long[i]!], i);
      expect(relErr(steps, batch)).toBeLessThan(1e-4);
    });
  }

  // Rounding activations to Q8 blocks (as llama.cpp does) is discontinuous: an f32 summation-order
  // difference of 1e-7 can move a value to the next quantisation step, so only tokens are compared.
  it('ggml activation rounding (the default): greedy 32 tokens equal the CPU reference', async () => {
    const source = await synthetic(options);
    const cpu = await greedy([await cpuStage(source, 0, 2)], 's', prompt, 32);
    const gpu = await greedy([await gpuStage(source, 0, 2)], 's', prompt, 32);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(5e-2);
  });
});

describe.each([
  ['qwen2', 'q8_0'],
  ['qwen3', 'q4_k_m'],
] as const)('synthetic %s (%s) model: neox RoPE, q/k/v biases (qwen2) or q/k norms (qwen3)', (arch, type) => {
  it('exact f32 activations: greedy 24 tokens through two WebGPU stages equal the CPU reference; last logits within 1e-3', async () => {
    const source = await synthetic({ arch, type, layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 1024, seed: 5 });
    const prompt = [1, 10, 300, 77, 900, 5];
    const exact = { activationRounding: 'none' } as const;
    const cpu = await greedy([await cpuStage(source, 0, 2, exact)], 'q', prompt, 24);
    const gpu = await greedy([await gpuStage(source, 0, 1, exact), await gpuStage(source, 1, 2, exact)], 'q', prompt, 24);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(relErr(gpu.logits, cpu.logits)).toBeLessThan(1e-3);
  });

  it('with an f16 KV cache: logits of a prefill and 4 decode steps within 1e-2 of the CPU reference', async () => {
    const source = await synthetic({ arch, type, layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 1024, seed: 5 });
    const exact = { activationRounding: 'none' } as const;
    const cpu = await cpuStage(source, 0, 2, exact);
    const gpu = await gpuStage(source, 0, 2, { ...exact, kvType: 'f16' });
    for (const b of [cpu, gpu]) await b.openSession('h', { contextLength: 32 });
    const steps = [[1, 10, 300, 77, 900, 5], [42], [7], [500], [99]];
    let pos = 0;
    for (const tokens of steps) {
      const want = await chainForward([cpu], 'h', tokens, pos);
      const got = await chainForward([gpu], 'h', tokens, pos);
      expect(relErr(got, want)).toBeLessThan(1e-2);
      pos += tokens.length;
    }
  });
});
