// The generation loop: prefill the prompt through a chain of stages, then sample one token at
// a time and feed it back, streaming text deltas, until EOS/EOG, a stop string, the token
// limit or the context limit. The chain is anything that turns token ids into last-position
// logits: in-process stages here, a remote route over the network elsewhere.

import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import { Sampler } from '../model/sampler.ts';
import type { SamplerOptions } from '../model/sampler.ts';
import { StreamingDecoder } from '../model/tokenizer/stream.ts';
import type { Tokenizer } from '../model/tokenizer/tokenizer.ts';

/**
 * The smallest thing generation needs from a route: per-session KV state on every stage and
 * a forward pass from token ids to the logits of the last position.
 */
export interface StageChain {
  /** opens the session on every stage, each with a KV cache of `contextLength` positions */
  openSession(sessionId: string, contextLength: number): Promise<void>;
  /**
   * Runs `tokens` at positions [position, position + n) through every stage and returns the
   * logits of the last one, [n_vocab]. `position` must be where the session stands
   * (POSITION_MISMATCH otherwise): nothing is ever recomputed.
   */
  forward(sessionId: string, tokens: Int32Array, position: number): Promise<Float32Array>;
  /** frees the session's KV cache on every stage */
  releaseSession(sessionId: string): Promise<void>;
}

/** A chain of StageBackends in this process: hidden states pass from one to the next. */
export class InProcessChain implements StageChain {
  /** wall time each stage spent computing, summed over calls, in ms */
  readonly stageComputeMs: number[];

  constructor(readonly stages: readonly StageBackend[]) {
    if (stages.length === 0) throw new MeshError('BAD_CHAIN', 'a chain needs at least one stage');
    this.stageComputeMs = stages.map(() => 0);
  }

  async openSession(sessionId: string, contextLength: number): Promise<void> {
    for (const s of this.stages) await s.openSession(sessionId, { contextLength });
  }

  async forward(sessionId: string, tokens: Int32Array, position: number): Promise<Float32Array> {
    let result = await this.stages[0]!.forward(sessionId, { kind: 'tokens', tokens }, position);
    this.stageComputeMs[0]! += result.computeMs;
    for (let i = 1; i < this.stages.length; i++) {
      const prev = result.output;
      if (prev.kind !== 'hidden') throw new MeshError('BAD_CHAIN', `stage ${i - 1} returned logits but is not the last stage`);
      result = await this.stages[i]!.forward(sessionId, { kind: 'hidden', hidden: prev.hidden, nTokens: prev.nTokens }, position);
      this.stageComputeMs[i]! += result.computeMs;
    }
    if (result.output.kind !== 'logits') throw new MeshError('BAD_CHAIN', 'the last stage returned hidden states, not logits');
    return result.output.logits;
  }

  async releaseSession(sessionId: string): Promise<void> {
    for (const s of this.stages) await s.releaseSession(sessionId);
  }

  async dispose(): Promise<void> {
    for (const s of this.stages) await s.dispose();
  }
}

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

const DEFAULT_PREFILL_CHUNK = 512;

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

/** Anything that generates from prompt tokens: a StageChain with our sampler, or llama.cpp. */
export interface TextGenerator {
  generate(request: GenerationRequest): Promise<GenerationResult>;
  dispose(): Promise<void>;
}

/** Generation over a StageChain, sampled and decoded here. */
export class ChainGenerator implements TextGenerator {
  constructor(
    readonly chain: StageChain & { dispose?(): Promise<void> },
    readonly tokenizer: Tokenizer,
  ) {}

  generate(request: GenerationRequest): Promise<GenerationResult> {
    return generate(this.chain, this.tokenizer, request);
  }

  async dispose(): Promise<void> {
    await this.chain.dispose?.();
  }
}

/**
 * Checks a generation request's prompt and token budget (EMPTY_PROMPT, BAD_REQUEST for
 * maxTokens, CONTEXT_FULL) and returns the context length it runs in: the one asked for, or
 * exactly room for the prompt and maxTokens. Local and route generation both start here.
 */
export function generationContextLength(prompt: readonly number[], maxTokens: number, contextLength?: number): number {
  if (prompt.length === 0) throw new MeshError('EMPTY_PROMPT', 'the prompt has no tokens');
  if (!Number.isInteger(maxTokens) || maxTokens < 0) {
    throw new MeshError('BAD_REQUEST', `maxTokens must be a non-negative integer, got ${maxTokens}`);
  }
  const n = contextLength ?? prompt.length + maxTokens;
  if (prompt.length > n) {
    throw new MeshError('CONTEXT_FULL', `the prompt has ${prompt.length} tokens, more than the context length ${n}`);
  }
  return n;
}

/** Runs one generation over `chain` (see GenerationRequest). */
export async function generate(chain: StageChain, tokenizer: Tokenizer, request: GenerationRequest): Promise<GenerationResult> {
  const prompt = [...request.promptTokens];
  const contextLength = generationContextLength(prompt, request.maxTokens, request.contextLength);
  const sampler = new Sampler(request.sampler);
  const sessionId = request.sessionId ?? `gen-${Math.random().toString(36).slice(2)}`;
  const out = new GenerationOutput(tokenizer, request.stopStrings, request.onDelta);
  const { text, decoder, tokens } = out;

  await chain.openSession(sessionId, contextLength);
  try {
    // prefill, in chunks when asked
    const chunk = request.prefillChunk ?? DEFAULT_PREFILL_CHUNK;
    let t0 = performance.now();
    let logits!: Float32Array;
    for (let at = 0; at < prompt.length; at += chunk) {
      logits = await chain.forward(sessionId, Int32Array.from(prompt.slice(at, at + chunk)), at);
    }
    out.promptMs = performance.now() - t0;

    let position = prompt.length;
    while (tokens.length < request.maxTokens) {
      if (request.signal?.aborted) {
        out.stopReason = 'aborted';
        break;
      }
      const token = sampler.sample(logits, prompt.concat(tokens));
      tokens.push(token);
      if (tokenizer.isEog(token) && !request.ignoreEog) {
        out.stopReason = 'eog';
        break;
      }
      if (text.push(decoder.push(token))) {
        out.stopReason = 'stop_string';
        break;
      }
      if (tokens.length === request.maxTokens) break;
      if (position >= contextLength) {
        out.stopReason = 'context_full';
        break;
      }
      // decode: one token through the chain
      t0 = performance.now();
      logits = await chain.forward(sessionId, Int32Array.of(token), position);
      out.decodeMs += performance.now() - t0;
      out.decodeSteps++;
      position++;
    }
    out.finish();
  } finally {
    await chain.releaseSession(sessionId);
  }

  return out.result(prompt);
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
 * What a generation loop produces, shared by local and on-route generation: the generated tokens,
 * their text (streamed through `decoder` into `text`, stop strings applied), why it stopped, and
 * the time spent in prefill and decode.
 */
export class GenerationOutput {
  readonly tokens: number[] = [];
  readonly text: TextCollector;
  readonly decoder: StreamingDecoder;
  stopReason: StopReason = 'max_tokens';
  promptMs = 0;
  decodeMs = 0;
  decodeSteps = 0;

  constructor(tokenizer: Tokenizer, stopStrings: readonly string[] | undefined, onDelta: ((delta: string) => void) | undefined) {
    this.text = new TextCollector(stopStrings ?? [], onDelta);
    this.decoder = new StreamingDecoder(tokenizer);
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
