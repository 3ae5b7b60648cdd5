// llama.cpp as an oracle for the engines: raw logits, greedy continuations and per-layer
// hidden states of a GGUF, computed by the libllama node-llama-cpp ships (through the koffi
// binding in src/backends/llamacpp/ffi.ts), with flash attention off and an F32 KV cache:
// the settings under which llama.cpp matches an exact f32 engine.
import { LlamaModelFfi } from '../../src/backends/llamacpp/ffi.ts';
import type { LlamaContextOptions } from '../../src/backends/llamacpp/ffi.ts';
import { argmax } from '../../src/model/sampler.ts';

export { argmax, LlamaModelFfi };

const EXACT: LlamaContextOptions = { flashAttention: false, kvType: 'f32', threads: 1 };

export interface OracleGreedy {
  /** logits after the prompt, [nVocab] */
  promptLogits: Float32Array;
  /** n greedy tokens (end-of-generation tokens do not stop it) */
  tokens: number[];
}

/** llama.cpp's greedy continuation of `prompt` and the logits it started from. */
export function oracleGreedy(model: LlamaModelFfi, prompt: readonly number[], n: number): OracleGreedy {
  const ctx = model.createContext({ ...EXACT, contextLength: prompt.length + n + 1 });
  try {
    let logits = ctx.decode(prompt);
    const promptLogits = logits;
    const tokens: number[] = [];
    for (let i = 0; i < n; i++) {
      const t = argmax(logits);
      tokens.push(t);
      if (i + 1 < n) logits = ctx.decode([t]);
    }
    return { promptLogits, tokens };
  } finally {
    ctx.dispose();
  }
}

/**
 * Hidden states after layers [0, k) for every prompt token, [nTokens × nEmbd], read from
 * llama.cpp's graph tensor `l_out-(k-1)` through the eval callback. k must be below the
 * layer count (the last layer's output holds only the last token's row).
 */
export function oracleHidden(model: LlamaModelFfi, prompt: readonly number[], k: number): Float32Array {
  const name = `l_out-${k - 1}`;
  const ctx = model.createContext({ ...EXACT, contextLength: prompt.length + 1, capture: [name] });
  try {
    ctx.decode(prompt);
    const h = ctx.captured(name);
    if (!h) throw new Error(`llama.cpp produced no ${name}`);
    return h;
  } finally {
    ctx.dispose();
  }
}

export { maxAbsDiff } from './batch-check.ts';

/**
 * The largest logit change one 8-bit activation-rounding flip has caused on the synthetic
 * models (measured ≤ 2.4e-2): engines that round activations the ggml way agree with llama.cpp
 * to ~1e-6 unless such a flip happened (test/cpu-synthetic.test.ts).
 */
export const FLIP_BOUND = 5e-2;

/** the gap between the largest and second-largest logit */
export function top2Gap(x: Float32Array): number {
  let a = -Infinity;
  let b = -Infinity;
  for (const v of x) {
    if (v > a) [a, b] = [v, a];
    else if (v > b) b = v;
  }
  return a - b;
}

/** llama.cpp's top-two logit gap after `prompt` + `tokens` (how near a tie its greedy pick there was) */
export function oracleGapAfter(model: LlamaModelFfi, prompt: readonly number[], tokens: readonly number[]): number {
  const ctx = model.createContext({ ...EXACT, contextLength: prompt.length + tokens.length + 1 });
  try {
    return top2Gap(ctx.decode([...prompt, ...tokens]));
  } finally {
    ctx.dispose();
  }
}
