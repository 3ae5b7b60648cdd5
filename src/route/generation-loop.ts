// The generation loop, one for every engine and every client (the CLI, the OpenAI API, the web
// chat and its component, benchmarks): prefill the prompt through a TokenStepper, then feed
// each generated token back, turning tokens into text deltas, until EOS/EOG (unless told to
// ignore it), a stop string, the token limit, the context limit or an abort. It times prefill
// and every decode step and, when asked, reports prefill progress, each step's per-stage timing
// and each token as telemetry events. It imports nothing Node-only: pages run it too.

import { MeshError } from '../errors.ts';
import { GenerationOutput } from '../model/generation-output.ts';
import type { GenerationRequest, GenerationResult, TextGenerator } from '../model/generation-output.ts';
import type { StepperSource, TokenStepper } from '../model/token-stepper.ts';
import type { Tokenizer } from '../model/tokenizer/tokenizer.ts';
import type { SampledLogprob, StepTiming } from '../protocol/payload.ts';
import { stepBreakdown } from './telemetry.ts';
import type { TelemetryEvent } from './telemetry.ts';

/** What the loop itself reads from a request (the engine's part went to the stepper). */
export interface LoopOptions {
  maxTokens: number;
  stopStrings?: readonly string[];
  /** keep generating past EOS/EOG tokens (benchmarks; llama.cpp's --ignore-eos) */
  ignoreEog?: boolean;
  signal?: AbortSignal;
  /** each piece of new text as soon as it is certain (never part of a stop string) */
  onDelta?: (delta: string) => void;
  /** prefill_progress per prompt chunk, then step_timing (where the stepper has it) and token per token */
  onEvent?: (e: TelemetryEvent) => void;
  /** the session the events name */
  sessionId?: string;
}

/** A stepper whose every step reports each stage's timing (a route's, from the reply trailers). */
export interface TimedStepper extends TokenStepper {
  /** the last step's records, one per stage (empty when the reply carried none) */
  readonly lastTimings: readonly StepTiming[];
  /** the last token's log-probabilities, where the session asked for them */
  readonly lastLogprob?: SampledLogprob | null;
}

/**
 * Checks a generation request's prompt and token budget (EMPTY_PROMPT, BAD_REQUEST for
 * maxTokens, CONTEXT_FULL) and returns the context length it runs in: the one asked for, or
 * exactly room for the prompt and maxTokens. Every generation starts here.
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

/**
 * Runs one generation on an open stepper (the caller opens and closes it). The prompt is
 * always prefilled; each token then passes, in this order: telemetry, EOG, stop strings,
 * maxTokens, the context limit, abort — so a token the engine already produced is kept, and
 * the last one is never fed back (nothing needs its output).
 */
export async function runGeneration(stepper: TokenStepper | TimedStepper, tokenizer: Tokenizer, prompt: readonly number[], opts: LoopOptions): Promise<GenerationOutput> {
  const out = new GenerationOutput(tokenizer, opts.stopStrings, opts.onDelta);
  const emit = opts.onEvent;
  const sessionId = opts.sessionId ?? '';
  const progress = emit && ((done: number, total: number) => emit({ type: 'prefill_progress', sessionId, tokensDone: done, tokensTotal: total }));
  const t0 = performance.now();
  let token = await stepper.prefill(prompt, progress);
  out.promptMs = performance.now() - t0;
  while (opts.maxTokens > 0) {
    out.tokens.push(token);
    const piece = out.decoder.push(token);
    if (emit) {
      // the step that produced this token, stage by stage
      const timings = 'lastTimings' in stepper ? stepper.lastTimings : [];
      if (timings.length > 0) emit({ type: 'step_timing', sessionId, position: timings[0]!.position, stages: stepBreakdown(timings) });
      const logprob = 'lastLogprob' in stepper ? stepper.lastLogprob : null;
      emit({ type: 'token', sessionId, id: token, text: piece, position: stepper.position, ...(logprob ? { logprob } : {}) });
    }
    if (tokenizer.isEog(token) && !opts.ignoreEog) {
      out.stopReason = 'eog';
      break;
    }
    if (out.text.push(piece)) {
      out.stopReason = 'stop_string';
      break;
    }
    if (out.tokens.length >= opts.maxTokens) break;
    if (stepper.position >= stepper.contextLength) {
      out.stopReason = 'context_full';
      break;
    }
    if (opts.signal?.aborted) {
      out.stopReason = 'aborted';
      break;
    }
    const s0 = performance.now();
    token = await stepper.decode(token);
    out.addStep(performance.now() - s0);
  }
  out.finish();
  return out;
}

/**
 * One whole generation: checks the request, opens a stepper for its context length, runs the
 * loop and closes the stepper whatever happens.
 */
export async function generateWith(tokenizer: Tokenizer, request: GenerationRequest, open: (contextLength: number) => Promise<TokenStepper>): Promise<GenerationResult> {
  const prompt = [...request.promptTokens];
  const stepper = await open(generationContextLength(prompt, request.maxTokens, request.contextLength));
  try {
    return (await runGeneration(stepper, tokenizer, prompt, request)).result(prompt);
  } finally {
    await stepper.close();
  }
}

/** A TextGenerator over any engine that opens steppers (llama.cpp's whole model, for one). */
export class StepperGenerator implements TextGenerator {
  constructor(
    readonly source: StepperSource,
    readonly tokenizer: Tokenizer,
  ) {}

  generate(request: GenerationRequest): Promise<GenerationResult> {
    const { sampler, prefillChunk } = request;
    return generateWith(this.tokenizer, request, (contextLength) =>
      this.source.openStepper({ contextLength, ...(sampler ? { sampler } : {}), ...(prefillChunk !== undefined ? { prefillChunk } : {}) }),
    );
  }

  dispose(): Promise<void> {
    return this.source.dispose();
  }
}
