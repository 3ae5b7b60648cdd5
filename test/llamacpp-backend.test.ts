// The llama.cpp backends on stories260K: the whole-model StageBackend (FFI) keeps positions
// and sessions like the CPU engine and refuses partial shards; the node-llama-cpp generator
// honours its options and agrees with the CPU route.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { ChainGenerator, InProcessChain } from '../src/route/generation.ts';
import { StepperGenerator } from '../src/route/generation-loop.ts';
import { maxAbsDiff } from './support/llamacpp-oracle.ts';
import { errorCode } from './support/errors.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';

let path: string;
let source: TensorSource;
let tokenizer: Tokenizer;

beforeAll(async () => {
  path = await stories260K();
  source = await openTensorSource(path);
  tokenizer = Tokenizer.fromMetadata(source.header.metadata);
});
afterAll(async () => {
  await source?.close();
});

describe('llama.cpp stage (whole model, FFI)', () => {
  it('serves whole models only, keeps positions per session, and matches the CPU engine\'s logits', async () => {
    const partial = new LlamaCppStage({ threads: 1 });
    expect(await errorCode(partial.load(source, { start: 0, end: 3 }))).toBe('UNSUPPORTED_SHARD');

    const stage = new LlamaCppStage({ threads: 1 });
    const cpu = new CpuBackend();
    await stage.load(source, { start: 0, end: 5 });
    await cpu.load(source, { start: 0, end: 5 });
    try {
      await stage.openSession('a', { contextLength: 32 });
      await stage.openSession('b', { contextLength: 32 });
      await cpu.openSession('a', { contextLength: 32 });
      const tokens = Int32Array.from(STORIES_PROMPT_TOKENS);
      expect(await errorCode(stage.forward('a', { kind: 'tokens', tokens }, 3))).toBe('POSITION_MISMATCH');
      const ours = await cpu.forward('a', { kind: 'tokens', tokens }, 0);
      const theirs = await stage.forward('a', { kind: 'tokens', tokens }, 0);
      if (ours.output.kind !== 'logits' || theirs.output.kind !== 'logits') throw new Error('expected logits');
      expect(maxAbsDiff(ours.output.logits, theirs.output.logits)).toBeLessThan(1e-4);
      // sessions are independent KV caches
      expect(stage.sessionStats('a').position).toBe(5);
      expect(stage.sessionStats('b').position).toBe(0);
      expect(stage.sessionStats('a').processedTokens).toEqual([5, 5, 5, 5, 5]);
      expect(stage.sessionStats('a').kvBytes).toBe(2 * 5 * 32 * 32 * 4);
      expect(await errorCode(stage.forward('a', { kind: 'hidden', hidden: new Float32Array(64), nTokens: 1 }, 5))).toBe('BAD_STAGE_INPUT');
      await stage.releaseSession('a');
      expect(await errorCode(stage.forward('a', { kind: 'tokens', tokens }, 0))).toBe('SESSION_UNKNOWN');
    } finally {
      await stage.dispose();
      await cpu.dispose();
    }
  });
});

describe('llama.cpp generator (node-llama-cpp)', () => {
  it('greedy text equals the CPU route\'s; flash attention and an f16 KV cache are options', async () => {
    const cpu = new CpuBackend();
    await cpu.load(source, { start: 0, end: 5 });
    const cpuGen = new ChainGenerator(new InProcessChain([cpu]), tokenizer);
    const request = { promptTokens: STORIES_PROMPT_TOKENS, maxTokens: 48 };
    const ref = await cpuGen.generate(request);
    await cpuGen.dispose();

    const exact = new StepperGenerator(await LlamaCppModel.load(path, { threads: 1, contextLength: 128 }), tokenizer);
    try {
      const r = await exact.generate(request);
      expect(r.tokens).toEqual(ref.tokens);
      expect(r.text).toBe(ref.text);
      expect(r.timings.prompt_tok_s).toBeGreaterThan(0);
      const stopped = await exact.generate({ ...request, stopStrings: ['Lily'] });
      expect(stopped.stopReason).toBe('stop_string');
      expect(stopped.text).toBe(', there was a little girl named ');
    } finally {
      await exact.dispose();
    }

    // llama.cpp's defaults (flash attention, f16 KV) agree to ~2e-3: on this model the greedy text holds
    const fast = new StepperGenerator(await LlamaCppModel.load(path, { threads: 1, contextLength: 128, flashAttention: true, kvType: 'f16' }), tokenizer);
    try {
      const r = await fast.generate({ ...request, maxTokens: 24 });
      expect(r.tokens).toEqual(ref.tokens.slice(0, 24));
    } finally {
      await fast.dispose();
    }
  });
});
