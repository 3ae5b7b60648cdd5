// Full-model generation with llama.cpp through node-llama-cpp's public API: LlamaCppModel
// opens one TokenStepper per generation (a context sequence evaluating the prompt, then one
// token at a time), so the one generation loop (route/generation-loop.ts, through
// StepperGenerator) runs it like the CPU route — same stop rules, same streamed text from our
// tokenizer. Sampling is llama.cpp's own (greedy is identical to ours; seeded sampling draws
// differently).

import type { Llama, LlamaContext, LlamaContextSequence, LlamaModel, Token, TokenBias } from 'node-llama-cpp';
import { MeshError } from '../../errors.ts';
import type { SamplerOptions } from '../../model/sampler.ts';
import type { StepperOptions, StepperSource, TokenStepper } from '../../model/token-stepper.ts';
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

/** A whole model in llama.cpp, one context, one generation (sequence) at a time. */
export class LlamaCppModel implements StepperSource {
  private constructor(
    readonly model: LlamaModel,
    private readonly context: LlamaContext,
    /** KV positions of the context */
    readonly contextLength: number,
  ) {}

  static async load(modelPath: string, options: LlamaCppOptions = {}): Promise<LlamaCppModel> {
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
    return new LlamaCppModel(model, context, contextLength);
  }

  /** a fresh sequence of the context, holding at most the context's positions */
  async openStepper(options: StepperOptions): Promise<TokenStepper> {
    return new LlamaCppStepper(this.context.getSequence(), Math.min(options.contextLength, this.contextLength), this.contextLength, options.sampler ?? {});
  }

  async dispose(): Promise<void> {
    await this.context.dispose();
    await this.model.dispose();
  }
}

/**
 * One generation on a context sequence. node-llama-cpp's evaluate() is itself a stepper: it
 * evaluates the prompt and yields a sampled token, and each next(token) evaluates that token
 * and yields the next. EOG tokens are yielded too: stopping on them is the loop's call.
 */
class LlamaCppStepper implements TokenStepper {
  position = 0;
  /** prompt and fed tokens, for the repetition penalty */
  private readonly history: number[] = [];
  private evaluation: AsyncGenerator<Token, void, void | Token | Token[]> | null = null;
  private closed = false;

  constructor(
    private readonly sequence: LlamaContextSequence,
    readonly contextLength: number,
    private readonly modelContextLength: number,
    private readonly sampler: SamplerOptions,
  ) {}

  async prefill(prompt: readonly number[], onProgress?: (done: number, total: number) => void): Promise<number> {
    if (this.evaluation) throw new MeshError('BAD_REQUEST', 'a llama.cpp stepper prefills once');
    if (prompt.length > this.modelContextLength) {
      throw new MeshError('CONTEXT_FULL', `the prompt has ${prompt.length} tokens, more than the context length ${this.modelContextLength}`);
    }
    this.history.push(...prompt);
    this.evaluation = this.sequence.evaluate([...prompt] as Token[], this.evaluateOptions(await this.tokenBias(this.sampler.logitBias)));
    const token = await this.next();
    this.position = prompt.length;
    onProgress?.(prompt.length, prompt.length);
    return token;
  }

  async decode(token: number): Promise<number> {
    if (!this.evaluation) throw new MeshError('BAD_REQUEST', 'decode before prefill');
    this.history.push(token);
    const next = await this.next(token as Token);
    this.position++;
    return next;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.evaluation?.return();
    this.sequence.dispose();
  }

  private async next(feed?: Token): Promise<number> {
    const r = await this.evaluation!.next(feed);
    if (r.done) throw new MeshError('LLAMACPP_EVAL_FAILED', `llama.cpp stopped evaluating at position ${this.position}`);
    return r.value;
  }

  /** logit_bias as llama.cpp's logit-bias sampler takes it: raw logit offsets (node-llama-cpp loaded lazily, as everywhere) */
  private async tokenBias(bias: Record<string, number> | undefined): Promise<TokenBias | undefined> {
    if (!bias || Object.keys(bias).length === 0) return undefined;
    const { TokenBias } = await import('node-llama-cpp');
    const tb = TokenBias.for(this.sequence.model);
    for (const [id, b] of Object.entries(bias)) tb.set(Number(id) as Token, { logit: b });
    return tb;
  }

  private evaluateOptions(tokenBias: TokenBias | undefined): NonNullable<Parameters<LlamaContextSequence['evaluate']>[1]> {
    const s = this.sampler;
    const lastN = s.repeatLastN ?? 64;
    return {
      temperature: s.temperature ?? 0,
      // node-llama-cpp's own defaults (top-k 40, top-p 0.95) would apply where ours are off
      topK: s.topK ?? 0,
      topP: s.topP ?? 1,
      minP: s.minP ?? 0,
      ...(s.seed !== undefined ? { seed: s.seed } : {}),
      ...((s.repeatPenalty ?? 1) !== 1 || (s.frequencyPenalty ?? 0) !== 0 || (s.presencePenalty ?? 0) !== 0
        ? {
            repeatPenalty: {
              penalty: s.repeatPenalty ?? 1,
              frequencyPenalty: s.frequencyPenalty ?? 0,
              presencePenalty: s.presencePenalty ?? 0,
              punishTokens: () => this.history.slice(-lastN) as Token[],
              maxPunishTokens: lastN,
            },
          }
        : {}),
      ...(tokenBias ? { tokenBias } : {}),
      yieldEogToken: true,
    };
  }
}
