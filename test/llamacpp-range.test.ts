// llama.cpp serving layer ranges (src/backends/llamacpp/range-stage.ts), in this process,
// against whole-model llama.cpp (flash attention off, F32 KV) on stories260K and on synthetic
// llama, qwen2 and qwen3 models in Q8_0 and Q4_K_M:
//   - chained llama.cpp ranges with f32 hops are llama.cpp itself: the hidden state after
//     each stage is bit-identical to the whole model's `l_out-(k-1)`, the logits are
//     bit-identical, and so are greedy tokens (2 and 3 stages);
//   - the hidden state after each stage agrees with the CPU reference's within the stage
//     tests' tolerances (1e-4 on F32; on quantised models within one 8-bit rounding flip, as
//     test/cpu-synthetic.test.ts bounds it);
//   - mixed chains (llama.cpp + CPU reference, either order) give llama.cpp's greedy tokens.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { LlamaCppRangeStage } from '../src/backends/llamacpp/range-stage.ts';
import type { ShardRange, StageBackend } from '../src/backends/types.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { ModelType, SyntheticArch } from '../src/model/synthetic-model.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { LlamaModelFfi, argmax, maxAbsDiff, oracleGreedy, oracleHidden } from './support/llamacpp-oracle.ts';
import { stories260K } from './support/models.ts';
import { syntheticModel } from './support/synthetic.ts';

const N = 16;
const PROMPT = 'The quick brown fox jumps over the lazy dog. It was';

const open: TensorSource[] = [];
afterAll(async () => {
  for (const s of open) await s.close();
});

/** greedy tokens of a chain over `prompt`, n of them */
async function chainGreedy(chain: InProcessChain, prompt: readonly number[], n: number): Promise<{ first: Float32Array; tokens: number[] }> {
  await chain.openSession('g', prompt.length + n);
  let logits = await chain.forward('g', Int32Array.from(prompt), 0);
  const first = logits;
  const tokens: number[] = [];
  for (let i = 0; i < n; i++) {
    tokens.push(argmax(logits));
    if (i + 1 < n) logits = await chain.forward('g', Int32Array.of(tokens[i]!), prompt.length + i);
  }
  await chain.releaseSession('g');
  return { first, tokens };
}

async function loaded<B extends StageBackend>(make: () => B, source: TensorSource, ranges: ShardRange[]): Promise<B[]> {
  const out: B[] = [];
  for (const r of ranges) {
    const b = make();
    await b.load(source, r);
    out.push(b);
  }
  return out;
}

/** the hidden state after each non-last stage of a chain, for the prompt */
async function stageHiddens(stages: StageBackend[], prompt: readonly number[]): Promise<Float32Array[]> {
  const out: Float32Array[] = [];
  for (const s of stages) await s.openSession('h', { contextLength: prompt.length });
  let r = await stages[0]!.forward('h', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0);
  for (let i = 1; i < stages.length; i++) {
    if (r.output.kind !== 'hidden') throw new Error(`stage ${i - 1} gave no hidden states`);
    out.push(r.output.hidden);
    r = await stages[i]!.forward('h', { kind: 'hidden', hidden: r.output.hidden, nTokens: r.output.nTokens }, 0);
  }
  for (const s of stages) await s.releaseSession('h');
  return out;
}

function rmsDiff(a: Float32Array, b: Float32Array): number {
  let s = 0;
  let r = 0;
  for (let i = 0; i < a.length; i++) {
    s += (a[i]! - b[i]!) ** 2;
    r += b[i]! ** 2;
  }
  return Math.sqrt(s / Math.max(r, 1e-30));
}

interface Case {
  name: string;
  path: () => Promise<string>;
  /** cut points: 2-stage and 3-stage chains */
  two: ShardRange[];
  three: ShardRange[];
  exactF32: boolean;
}

const synthetic = (arch: SyntheticArch, type: ModelType, tied = false): Case => ({
  name: `${arch} ${type}${tied ? ' tied' : ''}`,
  path: () => syntheticModel({ arch, type, layers: 3, embd: 256, heads: 4, kvHeads: 2, ffn: 512, tied }),
  two: [{ start: 0, end: 2 }, { start: 2, end: 3 }],
  three: [{ start: 0, end: 1 }, { start: 1, end: 2 }, { start: 2, end: 3 }],
  exactF32: false,
});

const CASES: Case[] = [
  { name: 'stories260K F32', path: stories260K, two: [{ start: 0, end: 2 }, { start: 2, end: 5 }], three: [{ start: 0, end: 1 }, { start: 1, end: 3 }, { start: 3, end: 5 }], exactF32: true },
  synthetic('llama', 'q8_0'),
  synthetic('llama', 'q4_k_m'),
  synthetic('qwen2', 'q8_0'),
  synthetic('qwen2', 'q4_k_m'),
  synthetic('qwen3', 'q8_0', true),
  synthetic('qwen3', 'q4_k_m'),
];

describe.each(CASES)('llama.cpp layer ranges: $name', (c) => {
  it('2 and 3 chained ranges are whole-model llama.cpp bit for bit; each hidden state matches the CPU reference', async () => {
    const path = await c.path();
    const source = await openTensorSource(path);
    open.push(source);
    const oracle = await LlamaModelFfi.load(path);
    const nLayer = configFromHeader(source.header).nLayer;
    const prompt = c.exactF32 ? [1, 403, 407, 261, 378] : oracle.tokenize(PROMPT);
    const ref = oracleGreedy(oracle, prompt, N);
    try {
      for (const ranges of [c.two, c.three]) {
        const stages = await loaded(() => new LlamaCppRangeStage({ threads: 1 }), source, ranges);
        // hidden states after each stage: llama.cpp's own l_out, exactly
        const hiddens = await stageHiddens(stages, prompt);
        hiddens.forEach((h, i) => expect(maxAbsDiff(h, oracleHidden(oracle, prompt, ranges[i]!.end)), `after ${ranges[i]!.end}`).toBe(0));
        const chain = new InProcessChain(stages);
        const got = await chainGreedy(chain, prompt, N);
        expect(maxAbsDiff(got.first, ref.promptLogits)).toBe(0);
        expect(got.tokens).toEqual(ref.tokens);
        // the CPU reference's hidden state after the same stages
        const cpu = await loaded(() => new CpuBackend(), source, ranges);
        const cpuHiddens = await stageHiddens(cpu, prompt);
        hiddens.forEach((h, i) => {
          console.log(`${c.name}: after layer ${ranges[i]!.end}, CPU reference vs llama.cpp: max ${maxAbsDiff(h, cpuHiddens[i]!).toExponential(2)}, relative rms ${rmsDiff(cpuHiddens[i]!, h).toExponential(2)}`);
          if (c.exactF32) expect(maxAbsDiff(h, cpuHiddens[i]!)).toBeLessThan(1e-4);
          else expect(rmsDiff(cpuHiddens[i]!, h), `relative rms after ${ranges[i]!.end}`).toBeLessThan(2e-2);
        });
        await chain.dispose();
        for (const b of cpu) await b.dispose();
      }
      // mixed chains: llama.cpp then the CPU reference, and the other way round
      const cut = c.two[0]!.end;
      for (const order of ['llamacpp-cpu', 'cpu-llamacpp'] as const) {
        const first = order === 'llamacpp-cpu' ? new LlamaCppRangeStage({ threads: 1 }) : new CpuBackend();
        const second = order === 'llamacpp-cpu' ? new CpuBackend() : new LlamaCppRangeStage({ threads: 1 });
        await first.load(source, { start: 0, end: cut });
        await second.load(source, { start: cut, end: nLayer });
        const chain = new InProcessChain([first, second]);
        expect((await chainGreedy(chain, prompt, N)).tokens, order).toEqual(ref.tokens);
        await chain.dispose();
      }
    } finally {
      oracle.dispose();
    }
  });
});
