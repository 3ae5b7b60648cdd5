// Shared llama.cpp oracle helpers (node-llama-cpp): one CPU-only Llama per test process, model
// loading, tokenisation as generation does it, and greedy generation with flash attention off
// and an F32 KV cache (the settings under which llama.cpp matches an exact f32 engine).
import { LlamaLogLevel, getLlama } from 'node-llama-cpp';
import type { Llama, LlamaContext, LlamaModel, Token } from 'node-llama-cpp';

let shared: Promise<Llama> | undefined;

/** The process-wide CPU Llama; never builds from source. */
export function sharedLlama(): Promise<Llama> {
  shared ??= getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
  return shared;
}

export async function loadModel(path: string, opts: { vocabOnly?: boolean } = {}): Promise<LlamaModel> {
  const llama = await sharedLlama();
  return llama.loadModel({ modelPath: path, gpuLayers: 0, ...(opts.vocabOnly ? { vocabOnly: true } : {}) });
}

/**
 * Tokenises like llama.cpp's generation does (common_tokenize with add_special): special
 * tokens parsed, and BOS first when the model asks for it. node-llama-cpp's
 * `model.tokenize(text, true)` parses specials but never adds BOS itself, so it is added here.
 */
export function tokenize(model: LlamaModel, text: string): number[] {
  const tokens: number[] = [...model.tokenize(text, true)];
  const bos = model.tokens.bos;
  if (model.tokens.shouldPrependBosToken && bos != null && tokens[0] !== bos) tokens.unshift(bos);
  return tokens;
}

/** A context with the settings that make llama.cpp comparable to an exact f32 engine. */
export function createExactContext(model: LlamaModel, contextSize = 256): Promise<LlamaContext> {
  return model.createContext({
    contextSize,
    flashAttention: false,
    experimentalKvCacheKeyType: 'F32',
    experimentalKvCacheValueType: 'F32',
    threads: 1,
  });
}

/**
 * Greedy-generates exactly `n` tokens after `prompt` (text is tokenised as above). End-of-
 * generation tokens do not stop it: random-weight models pick them like any other token.
 */
export async function greedyGenerate(model: LlamaModel, prompt: string | number[], n: number, contextSize?: number): Promise<number[]> {
  const tokens = typeof prompt === 'string' ? tokenize(model, prompt) : prompt;
  const context = await createExactContext(model, contextSize ?? Math.max(64, tokens.length + n + 8));
  try {
    const out: number[] = [];
    if (n <= 0) return out;
    for await (const t of context.getSequence().evaluate(tokens as Token[], { temperature: 0 })) {
      out.push(t);
      if (out.length >= n) break;
    }
    return out;
  } finally {
    await context.dispose();
  }
}
