// The text side of generation, for the one generation loop (route/generation-loop.ts) over
// every engine (local chains, routes, llama.cpp): what a request asks for, what a result
// holds, and the output state — generated tokens decoded into text deltas that never split a
// character, stop strings held back and cut, the stop reason, and prefill/decode timings.

import type { SamplerOptions } from './sampler.ts';
import { StreamingDecoder } from './tokenizer/stream.ts';
import type { Tokenizer } from './tokenizer/tokenizer.ts';

export interface GenerationRequest {
  /** prompt token ids, BOS included when the model wants it */
  promptTokens: readonly number[];
  /** most tokens to generate */
  maxTokens: number;
  sampler?: SamplerOptions;
  /** generation stops when the text contains one of these; the text is cut before it */
  stopStrings?: readonly string[];
  /** KV positions to reserve (default: prompt + maxTokens) */
  contextLength?: number;
  /** prompt tokens per forward call during prefill (default 512, as llama.cpp's ubatch: bounds activation memory) */
  prefillChunk?: number;
  /** called with each piece of new text as soon as it is certain (never part of a stop string) */
  onDelta?: (delta: string) => void;
  signal?: AbortSignal;
  /** keep generating past EOS/EOG tokens (benchmarks; llama.cpp's --ignore-eos) */
  ignoreEog?: boolean;
  /** session id on the chain (default: a fresh random one); the session is released at the end */
  sessionId?: string;
}

export type StopReason = 'eog' | 'stop_string' | 'max_tokens' | 'context_full' | 'aborted';

export interface GenerationTimings {
  /** prefill: from the first prompt forward to the first logits */
  prompt_ms: number;
  /** every later forward (one token each) */
  decode_ms: number;
  /** prompt tokens / prompt seconds */
  prompt_tok_s: number;
  /** decode forwards / decode seconds (the last sampled token is not run: nothing needs its output) */
  decode_tok_s: number;
}

export interface GenerationResult {
  promptTokens: number[];
  /** generated tokens, including a final EOG token when that ended generation */
  tokens: number[];
  /** text of the generated tokens, cut before a stop string */
  text: string;
  stopReason: StopReason;
  timings: GenerationTimings;
}

/** Anything that generates from prompt tokens: a StageChain with our sampler, or llama.cpp (route/generation-loop.ts runs both). */
export interface TextGenerator {
  generate(request: GenerationRequest): Promise<GenerationResult>;
  dispose(): Promise<void>;
}

export function makeTimings(promptMs: number, promptTokens: number, decodeMs: number, decodeSteps: number): GenerationTimings {
  return {
    prompt_ms: round(promptMs),
    decode_ms: round(decodeMs),
    prompt_tok_s: promptMs > 0 ? round((promptTokens * 1000) / promptMs) : 0,
    decode_tok_s: decodeMs > 0 ? round((decodeSteps * 1000) / decodeMs) : 0,
  };
}

function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/**
 * What the generation loop produces, whatever the engine: the generated tokens,
 * their text (streamed through `decoder` into `text`, stop strings applied), why it stopped, and
 * the time spent in prefill and decode.
 */
export class GenerationOutput {
  readonly tokens: number[] = [];
  readonly text: TextCollector;
  readonly decoder: StreamingDecoder;
  stopReason: StopReason = 'max_tokens';
  promptMs = 0;
  /** wall time of each decode step, in ms */
  readonly stepMs: number[] = [];
  decodeMs = 0;

  constructor(tokenizer: Tokenizer, stopStrings: readonly string[] | undefined, onDelta: ((delta: string) => void) | undefined) {
    this.text = new TextCollector(stopStrings ?? [], onDelta);
    this.decoder = new StreamingDecoder(tokenizer);
  }

  get decodeSteps(): number {
    return this.stepMs.length;
  }

  /** records one decode step's wall time */
  addStep(ms: number): void {
    this.stepMs.push(ms);
    this.decodeMs += ms;
  }

  /** after the loop: the decoder's held-back bytes join the text unless a stop string ended it */
  finish(): void {
    if (this.stopReason !== 'stop_string') this.text.push(this.decoder.flush(), true);
  }

  result(prompt: number[]): GenerationResult {
    return {
      promptTokens: prompt,
      tokens: this.tokens,
      text: this.text.text,
      stopReason: this.stopReason,
      timings: makeTimings(this.promptMs, prompt.length, this.decodeMs, this.decodeSteps),
    };
  }
}

/**
 * Accumulates generated text, holds back any tail that could still become a stop string, and
 * emits the rest as deltas.
 */
export class TextCollector {
  /** text emitted so far (final once generation ends) */
  text = '';
  private pending = '';

  constructor(
    private readonly stopStrings: readonly string[],
    private readonly onDelta?: (delta: string) => void,
  ) {}

  /** adds text; returns true when a stop string appeared (the text is cut before it) */
  push(piece: string, final = false): boolean {
    this.pending += piece;
    let hit = -1;
    for (const s of this.stopStrings) {
      if (s.length === 0) continue;
      const at = this.pending.indexOf(s);
      if (at >= 0 && (hit < 0 || at < hit)) hit = at;
    }
    if (hit >= 0) {
      this.emit(this.pending.slice(0, hit));
      this.pending = '';
      return true;
    }
    const hold = final ? 0 : this.heldBack();
    this.emit(this.pending.slice(0, this.pending.length - hold));
    this.pending = this.pending.slice(this.pending.length - hold);
    return false;
  }

  /** length of the longest tail of `pending` that is a proper prefix of a stop string */
  private heldBack(): number {
    let hold = 0;
    for (const s of this.stopStrings) {
      for (let n = Math.min(s.length - 1, this.pending.length); n > hold; n--) {
        if (this.pending.endsWith(s.slice(0, n))) {
          hold = n;
          break;
        }
      }
    }
    return hold;
  }

  private emit(delta: string): void {
    if (delta.length === 0) return;
    this.text += delta;
    this.onDelta?.(delta);
  }
}
