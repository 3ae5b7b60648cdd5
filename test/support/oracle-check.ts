// One check every engine and route takes against llama.cpp on a synthetic model: free-running
// greedy decoding from a prompt, compared token for token with llama.cpp's (flash attention
// off, F32 KV cache), and the prompt's logits compared value for value.
//
// F32 (and F16) weights: tokens identical, prompt logits within `tolerance`. Quantised weights:
// ggml rounds activations to 8-bit blocks before each matmul and so do our engines; an f32
// difference in the last bit sometimes moves one activation across a rounding boundary and
// logits then differ by ~1e-2 (see test/cpu-synthetic.test.ts). So there: prompt logits within
// one flip (FLIP_BOUND), and tokens identical up to the first position where llama.cpp's own
// top two logits are closer than two flips. Every case logs what it measured.
import { expect } from 'vitest';
import { CpuBackend } from '../../src/backends/cpu/backend.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import type { StageChain } from '../../src/route/generation.ts';
import { argmax, FLIP_BOUND, maxAbsDiff, oracleGreedy, oracleHidden, top2Gap } from './llamacpp-oracle.ts';
import type { LlamaModelFfi } from './llamacpp-oracle.ts';

export { FLIP_BOUND, top2Gap };

export interface OracleCheck {
  /** max |logit − llama.cpp's| after the prompt */
  promptDiff: number;
  tokens: number[];
  reference: number[];
  /** first position where the tokens differ, -1 when identical */
  firstDiff: number;
}

/**
 * Greedy-decodes `n` tokens after `prompt` on `chain` and on llama.cpp and asserts they agree
 * (exactly when `exact`, else up to a llama.cpp near-tie); returns the figures.
 */
export async function expectGreedyMatchesOracle(
  label: string,
  chain: StageChain,
  oracle: LlamaModelFfi,
  prompt: readonly number[],
  n: number,
  opts: { exact: boolean; tolerance: number },
): Promise<OracleCheck> {
  const ref = oracleGreedy(oracle, prompt, n);
  const session = `check-${label}`;
  await chain.openSession(session, prompt.length + n);
  let logits = await chain.forward(session, Int32Array.from(prompt), 0);
  const promptDiff = maxAbsDiff(logits, ref.promptLogits);
  const tokens: number[] = [];
  for (let i = 0; i < n; i++) {
    tokens.push(argmax(logits));
    if (i + 1 < n) logits = await chain.forward(session, Int32Array.of(tokens[i]!), prompt.length + i);
  }
  await chain.releaseSession(session);
  const firstDiff = tokens.findIndex((t, i) => t !== ref.tokens[i]);
  console.log(`${label}: prompt logits max diff ${promptDiff.toExponential(2)}, greedy ${firstDiff < 0 ? `identical (${n} tokens)` : `differs from token ${firstDiff}`}`);
  if (opts.exact) {
    expect(promptDiff, `${label} prompt logits`).toBeLessThan(opts.tolerance);
    expect(tokens, `${label} greedy tokens`).toEqual(ref.tokens);
  } else {
    expect(promptDiff, `${label} prompt logits`).toBeLessThan(FLIP_BOUND);
    if (firstDiff >= 0) {
      // tokens may only part where llama.cpp itself nearly ties
      const ctx = oracle.createContext({ contextLength: prompt.length + firstDiff + 1, flashAttention: false, kvType: 'f32', threads: 1 });
      const at = ctx.decode([...prompt, ...ref.tokens.slice(0, firstDiff)]);
      ctx.dispose();
      expect(top2Gap(at), `${label}: free-running tokens differ at ${firstDiff}`).toBeLessThan(2 * FLIP_BOUND);
    }
  }
  return { promptDiff, tokens, reference: ref.tokens, firstDiff };
}

/** The CPU reference's first stage [0, 1) on the prompt equals llama.cpp's l_out-0 within `tolerance`. */
export async function expectFirstLayerMatchesOracle(source: TensorSource, oracle: LlamaModelFfi, prompt: readonly number[], tolerance: number): Promise<void> {
  const first = new CpuBackend();
  await first.load(source, { start: 0, end: 1 });
  await first.openSession('h', { contextLength: prompt.length });
  const out = (await first.forward('h', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
  await first.dispose();
  expect(out.kind).toBe('hidden');
  if (out.kind === 'hidden') expect(maxAbsDiff(out.hidden, oracleHidden(oracle, prompt, 1))).toBeLessThan(tolerance);
}
