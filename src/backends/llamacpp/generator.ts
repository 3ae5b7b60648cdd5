// Full-model generation with llama.cpp through node-llama-cpp's public API, behind the same
// TextGenerator interface as the CPU route. Sampling is llama.cpp's own (greedy is identical
// to ours; seeded sampling draws differently). Text deltas come from our tokenizer, so both
// routes stream the same way.

import type { Llama, LlamaContext, LlamaModel, Token } from 'node-llama-cpp';
import { MeshError } from '../../errors.ts';
import { StreamingDecoder } from '../../model/tokenizer/stream.ts';
import type { Tokenizer } from '../../model/tokenizer/tokenizer.ts';
import { TextCollector, makeTimings } from '../../model/generation-output.ts';
import type { GenerationRequest, GenerationResult, StopReason, TextGenerator } from '../../model/generation-output.ts';
import { defaultLlamaThreads } from './ffi.ts';
import type { KvType } from './ffi.ts';

export interface LlamaCppOptions {
  /** CPU threads (default: defaultLlamaThreads(), all cores but one) */
  threads?: number;
  /** KV cache positions (default 2048) */
  contextLength?: number;
  /** default false: exact attention, the same numbers as the CPU reference to ~1e-5 */
  flashAttention?: boolean;
  /** KV cache element type (default 'f32') */
  kvType?: KvType;
  /** tokens per llama.cpp batch (default 512) */
  batchSize?: number;
}

const KV_TYPE_NAMES: Record<KvType, 'F32' | 'F16' | 'Q8_0' | 'Q4_0'> = { f32: 'F32', f16: 'F16', q8_0: 'Q8_0', q4_0: 'Q4_0' };

let llamaInstance: Promise<Llama> | null = null;

/** One llama.cpp runtime per process, CPU only, from node-llama-cpp's prebuilt binaries. */
export function getLlamaRuntime(): Promise<Llama> {
  if (!llamaInstance) {
    llamaInstance = (async () => {
      const { getLlama, LlamaLogLevel } = await import('node-llama-cpp');
      return getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
    })();
  }
  return llamaInstance;
}

export class LlamaCppGenerator implements TextGenerator {
  private constructor(
    readonly model: LlamaModel,
    private readonly context: LlamaContext,
    readonly tokenizer: Tokenizer,
    readonly contextLength: number,
  ) {}

  static async load(modelPath: string, tokenizer: Tokenizer, options: LlamaCppOptions = {}): Promise<LlamaCppGenerator> {
    const llama = await getLlamaRuntime();
    let model: LlamaModel;
    try {
      model = await llama.loadModel({ modelPath, gpuLayers: 0 });
    } catch (e) {
      throw new MeshError('LLAMACPP_LOAD_FAILED', `llama.cpp could not load ${modelPath}: ${(e as Error).message}`);
    }
    const contextLength = options.contextLength ?? 2048;
    const kv = KV_TYPE_NAMES[options.kvType ?? 'f32'];
    const context = await model.createContext({
      contextSize: contextLength,
      batchSize: options.batchSize ?? Math.min(512, contextLength),
      flashAttention: options.flashAttention ?? false,
      experimentalKvCacheKeyType: kv,
      experimentalKvCacheValueType: kv,
      threads: options.threads ?? defaultLlamaThreads(),
    });
    return new LlamaCppGenerator(model, context, tokenizer, contextLength);
  }

  async generate(request: GenerationRequest): Promise<GenerationResult> {
    const prompt = [...request.promptTokens];
    if (prompt.length === 0) throw new MeshError('EMPTY_PROMPT', 'the prompt has no tokens');
    if (prompt.length > this.contextLength) {
      throw new MeshError('CONTEXT_FULL', `the prompt has ${prompt.length} tokens, more than the context length ${this.contextLength}`);
    }
    const s = request.sampler ?? {};
    const text = new TextCollector(request.stopStrings ?? [], request.onDelta);
    const decoder = new StreamingDecoder(this.tokenizer);
    const tokens: number[] = [];
    let stopReason: StopReason = 'max_tokens';
    const sequence = this.context.getSequence();
    const started = performance.now();
    let firstAt = 0;
    let lastAt = 0;
    try {
      if (request.maxTokens > 0) {
        const lastN = s.repeatLastN ?? 64;
        const evaluation = sequence.evaluate(prompt as Token[], {
          temperature: s.temperature ?? 0,
          ...(s.topK ? { topK: s.topK } : {}),
          ...(s.topP !== undefined ? { topP: s.topP } : {}),
          ...(s.minP !== undefined ? { minP: s.minP } : {}),
          ...(s.seed !== undefined ? { seed: s.seed } : {}),
          ...(s.repeatPenalty !== undefined && s.repeatPenalty !== 1
            ? { repeatPenalty: { penalty: s.repeatPenalty, punishTokens: () => prompt.concat(tokens).slice(-lastN) as Token[], maxPunishTokens: lastN } }
            : {}),
        });
        for await (const token of evaluation) {
          lastAt = performance.now();
          if (tokens.length === 0) firstAt = lastAt;
          tokens.push(token);
          if (this.tokenizer.isEog(token) && !request.ignoreEog) {
            stopReason = 'eog';
            break;
          }
          if (text.push(decoder.push(token))) {
            stopReason = 'stop_string';
            break;
          }
          if (tokens.length >= request.maxTokens) break;
          if (request.signal?.aborted) {
            stopReason = 'aborted';
            break;
          }
          if (prompt.length + tokens.length >= this.contextLength) {
            stopReason = 'context_full';
            break;
          }
        }
      }
      if (stopReason !== 'stop_string') text.push(decoder.flush(), true);
    } finally {
      sequence.dispose();
    }
    const promptMs = tokens.length > 0 ? firstAt - started : 0;
    return {
      promptTokens: prompt,
      tokens,
      text: text.text,
      stopReason,
      timings: makeTimings(promptMs, prompt.length, tokens.length > 1 ? lastAt - firstAt : 0, Math.max(0, tokens.length - 1)),
    };
  }

  async dispose(): Promise<void> {
    await this.context.dispose();
    await this.model.dispose();
  }
}
