// The sampler chain against llama.cpp's (node-llama-cpp, flash attention off, F32 KV): for the
// same settings and seed, the CPU engine with our Sampler and llama.cpp generate the same
// tokens on stories260K — top-k, top-p, min-p, temperature, the three penalties over llama.cpp's
// window, logit bias, and the seeded draw (std::mt19937). Plus the sampler's own rules.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { Mt19937 } from '../src/model/mt19937.ts';
import { Sampler, tokenLogprob } from '../src/model/sampler.ts';
import type { SamplerOptions } from '../src/model/sampler.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { ChainGenerator, InProcessChain } from '../src/route/generation.ts';
import { StepperGenerator } from '../src/route/generation-loop.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';

let source: TensorSource;
let tokenizer: Tokenizer;
let ours: ChainGenerator;
let llama: StepperGenerator;

beforeAll(async () => {
  const path = await stories260K();
  source = await openTensorSource(path);
  tokenizer = Tokenizer.fromMetadata(source.header.metadata);
  const cpu = new CpuBackend();
  await cpu.load(source, { start: 0, end: 5 });
  ours = new ChainGenerator(new InProcessChain([cpu]), tokenizer);
  llama = new StepperGenerator(await LlamaCppModel.load(path, { threads: 1, contextLength: 256 }), tokenizer);
});
afterAll(async () => {
  await ours?.dispose();
  await llama?.dispose();
  await source?.close();
});

describe('mt19937', () => {
  it('is the standard generator: 10000th output for the default seed 5489 is 4123659995', () => {
    const r = new Mt19937(5489);
    let x = 0;
    for (let i = 0; i < 10000; i++) x = r.nextU32();
    expect(x).toBe(4123659995);
  });
});

// node-llama-cpp always puts a top-k sampler in its chain (k = n_vocab for 0), and top-k sorts
// the candidates; llama.cpp's own top_k(0) leaves them in id order, which changes which token a
// draw lands on (not the distribution). So every sampled case names a top-k (512 = n_vocab: off).
const SETTINGS: Array<[string, SamplerOptions]> = [
  ['temperature only', { temperature: 0.9, topK: 512, seed: 1 }],
  ['top-k, top-p, min-p', { temperature: 0.8, topK: 40, topP: 0.9, minP: 0.05, seed: 42 }],
  ['hot with a wide top-k (bucket sort in llama.cpp)', { temperature: 1.5, topK: 200, seed: 7 }],
  ['top-p alone', { temperature: 1.1, topK: 512, topP: 0.8, seed: 3 }],
  ['min-p alone', { temperature: 1.2, topK: 512, minP: 0.1, seed: 11 }],
  ['repeat, frequency and presence penalties, greedy', { repeatPenalty: 1.3, frequencyPenalty: 0.4, presencePenalty: 0.6 }],
  ['penalties with a short window, sampled', { temperature: 0.7, topK: 20, repeatPenalty: 1.1, frequencyPenalty: 0.2, presencePenalty: 0.3, repeatLastN: 8, seed: 5 }],
  ['logit bias: a ban and a push, greedy', { logitBias: { '261': -Infinity, '395': 2.5 } }],
  ['logit bias and penalties, sampled', { temperature: 1, topK: 50, logitBias: { '400': 1.5, '13': -3 }, repeatPenalty: 1.2, seed: 99 }],
];

describe('sampler chain = llama.cpp\'s (node-llama-cpp) on stories260K', () => {
  for (const [name, sampler] of SETTINGS) {
    it(name, async () => {
      const request = { promptTokens: STORIES_PROMPT_TOKENS, maxTokens: 64, sampler, ignoreEog: true };
      const a = await ours.generate(request);
      const b = await llama.generate(request);
      expect(a.tokens.length).toBe(64);
      expect(a.tokens).toEqual(b.tokens);
    });
  }

  it('the settings change the tokens (the comparison above can fail)', async () => {
    const base = await ours.generate({ promptTokens: STORIES_PROMPT_TOKENS, maxTokens: 64, ignoreEog: true });
    for (const [, sampler] of SETTINGS) {
      const r = await ours.generate({ promptTokens: STORIES_PROMPT_TOKENS, maxTokens: 64, sampler, ignoreEog: true });
      expect(r.tokens).not.toEqual(base.tokens);
    }
  });
});

describe('sampler rules', () => {
  it('a banned token never comes, whatever the seed', () => {
    const logits = Float32Array.of(3, 2, 1, 0);
    for (let seed = 0; seed < 50; seed++) expect(new Sampler({ temperature: 2, seed, logitBias: { '0': -Infinity } }).sample(logits)).not.toBe(0);
  });

  it('frequency penalty counts occurrences, presence penalty counts once', () => {
    const logits = Float32Array.of(1, 0.75);
    // token 0 seen 3 times: 1 − 3·0.1 = 0.7 < 0.75
    expect(new Sampler({ frequencyPenalty: 0.1 }).sample(logits, [0, 0, 0])).toBe(1);
    expect(new Sampler({ frequencyPenalty: 0.1 }).sample(logits, [0, 0])).toBe(0);
    expect(new Sampler({ presencePenalty: 0.2 }).sample(logits, [0, 0, 0, 0])).toBe(0); // 0.8 > 0.75
    expect(new Sampler({ presencePenalty: 0.3 }).sample(logits, [0])).toBe(1);
    // outside the window, no penalty
    expect(new Sampler({ presencePenalty: 0.3, repeatLastN: 2 }).sample(logits, [0, 1, 1])).toBe(0);
  });

  it('logprobs are the raw log-softmax, top alternatives most likely first', () => {
    const logits = Float32Array.of(0, Math.log(3), Math.log(6));
    const lp = tokenLogprob(logits, 0, 2);
    expect(lp.logprob).toBeCloseTo(Math.log(0.1), 6);
    expect(lp.top.map((t) => t.token)).toEqual([2, 1]);
    expect(lp.top[0]!.logprob).toBeCloseTo(Math.log(0.6), 6);
  });
});
