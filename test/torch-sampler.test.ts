// The PyTorch peer's sampler chain (peers/torch/gguf_mesh_torch/sampler.py, mt19937.py) against
// the TypeScript stage's (src/model/sampler.ts, which test/sampler-llamacpp.test.ts holds to
// llama.cpp): docs/protocol.md specifies one chain and one std::mt19937 draw, so for the same
// logits, history, settings and seed both pick the same tokens, make the same number of draws,
// continue alike after skipped draws, report the same log-probabilities, and refuse the same
// bad settings. Logits are random here, with ties and a few dominant tokens, 512 of them.
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { Sampler, tokenLogprob } from '../src/model/sampler.ts';
import type { SamplerOptions } from '../src/model/sampler.ts';
import { findTorchPython, TORCH_PEER_DIR } from '../src/peer/torch-process.ts';
import { mulberry32 } from './support/prng.ts';

interface TorchSampled {
  tokens: number[];
  logprobs: Array<{ logprob: number; top: Array<[number, number]> }>;
  draws: number;
}

/** `python -m gguf_mesh_torch sample`: the peer's sampler over the steps; its error text when it refuses. */
function torchSample(req: object): Promise<TorchSampled> {
  const python = findTorchPython().python;
  return new Promise((resolve, reject) => {
    const child = spawn(python, ['-m', 'gguf_mesh_torch', 'sample'], { cwd: TORCH_PEER_DIR, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.stderr.on('data', (d: Buffer) => (err += d));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(err.trim()))));
    child.stdin.end(JSON.stringify(req));
  });
}

const VOCAB = 512;

/**
 * Random logits per step: spread like a small model's, 16 favourite tokens ahead (so sampled
 * tokens repeat and the penalties bite), some exact ties, now and then one token far ahead.
 */
function randomLogits(steps: number, seed: number): Float32Array[] {
  const r = mulberry32(seed);
  return Array.from({ length: steps }, () => {
    const x = Float32Array.from({ length: VOCAB }, (_, i) => (r() + r() + r() - 1.5) * 4 + (i % 32 === 0 ? 5 : 0));
    for (let i = 0; i < 8; i++) x[Math.floor(r() * VOCAB)] = x[Math.floor(r() * VOCAB)]!; // ties
    if (r() < 0.3) x[Math.floor(r() * VOCAB)] = 12 + r() * 4;
    return x;
  });
}

const SETTINGS: Array<[string, SamplerOptions]> = [
  ['greedy', { temperature: 0 }],
  ['temperature only (candidates in id order)', { temperature: 0.9, seed: 4321 }],
  ['temperature and top-p, as the repair tests sample', { temperature: 0.9, topP: 0.95, seed: 4321 }],
  ['top-k, top-p, min-p', { temperature: 0.8, topK: 40, topP: 0.9, minP: 0.05, seed: 42 }],
  ['min-p alone (unsorted)', { temperature: 1.2, minP: 0.1, seed: 11 }],
  ['hot, wide top-k', { temperature: 1.5, topK: 200, seed: 7 }],
  ['penalties, greedy', { repeatPenalty: 1.3, frequencyPenalty: 0.4, presencePenalty: 0.6 }],
  ['penalties with a short window, sampled', { temperature: 0.7, topK: 20, repeatPenalty: 1.1, frequencyPenalty: 0.2, presencePenalty: 0.3, repeatLastN: 8, seed: 5 }],
  ['logit bias and penalties, sampled', { temperature: 1, topK: 50, logitBias: { '400': 1.5, '13': -100 }, repeatPenalty: 1.2, seed: 99 }],
];

describe('PyTorch peer: the sampler chain and draw as the TypeScript stage makes them', () => {
  it.each(SETTINGS)('%s: the same tokens, draws and log-probabilities over 60 steps, and after 25 skipped draws', async (_name, settings) => {
    const steps = randomLogits(60, 17);
    const prompt = [1, 400, 13, 64, 64, 96];
    const ts = new Sampler(settings);
    const history = [...prompt];
    const req = { settings, draws: 0, logprobs: 3, steps: [] as Array<{ logits: number[]; history: number[] }> };
    const tokens: number[] = [];
    for (const logits of steps) {
      req.steps.push({ logits: Array.from(logits), history: [...history] });
      const t = ts.sample(logits, history);
      tokens.push(t);
      history.push(t);
    }
    const torch = await torchSample(req);
    expect(torch.tokens).toEqual(tokens);
    expect(torch.draws).toBe(ts.draws);
    steps.forEach((logits, i) => {
      const lp = tokenLogprob(logits, tokens[i]!, 3);
      // both round their f64 log-softmax to f32 for the Token frame
      expect(Math.fround(torch.logprobs[i]!.logprob)).toBe(Math.fround(lp.logprob));
      expect(torch.logprobs[i]!.top.map(([id, l]) => [id, Math.fround(l)])).toEqual(lp.top.map((t) => [t.token, Math.fround(t.logprob)]));
    });
    // a replacement last stage: the draws made so far skipped, then the same continuation
    const rest = await torchSample({ ...req, draws: 25, steps: req.steps.slice(25), logprobs: null });
    const resumed = new Sampler(settings).skip(25);
    expect(rest.tokens).toEqual(req.steps.slice(25).map((s, i) => resumed.sample(steps[25 + i]!, s.history)));
  }, 60_000);

  it.each([
    ['temperature', { temperature: -1 }],
    ['topK', { topK: 1.5 }],
    ['topP', { topP: 0 }],
    ['minP', { minP: 2 }],
    ['repeatPenalty', { repeatPenalty: 0 }],
    ['repeatLastN', { repeatLastN: -1 }],
    ['seed', { seed: 2 ** 32 }],
    ['logitBias', { logitBias: { x: 1 } }],
  ])('refuses a bad %s as BAD_SAMPLER_OPTION, as the TypeScript stage does', async (name, settings) => {
    expect(() => new Sampler(settings as SamplerOptions)).toThrow(new RegExp(name));
    await expect(torchSample({ settings, steps: [] })).rejects.toThrow(new RegExp(`^BAD_SAMPLER_OPTION: ${name}`));
  });
});
