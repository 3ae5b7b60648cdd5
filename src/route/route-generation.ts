// Generation where the route samples: the prompt goes to stage 0 in chunks, the last stage
// samples each token (temperature, top-p, seed travel in the session's open frame), and the
// one generation loop (generation-loop.ts) only decodes text, watches for end-of-generation
// and stop strings, and reports telemetry. RouteStepper is a route session as a TokenStepper
// over any FrameLink; the signaling server's OpenAI-compatible API runs generateOnRoute on
// it, the page's chat (ui/chat-engine.ts) runs the loop on it over HTTP.

import { MeshError } from '../errors.ts';
import type { Tokenizer } from '../model/tokenizer/tokenizer.ts';
import type { TokenStepper } from '../model/token-stepper.ts';
import type { FrameLink } from '../transport/link.ts';
import { ClientStepper, DEFAULT_PREFILL_CHUNK, RouteSessionClient } from './client.ts';
import { generationContextLength, runGeneration } from './generation-loop.ts';
import type { TimedStepper } from './generation-loop.ts';
import { ConstrainedStepper } from './constrained-stepper.ts';
import type { TokenConstraint } from './constrained-stepper.ts';
import type { GenerationResult } from '../model/generation-output.ts';
import type { SessionInfo } from './sessions.ts';
import { usesPenalties } from '../protocol/session.ts';
import type { SamplerSettings, SessionOpenBody } from '../protocol/session.ts';
export { usesPenalties } from '../protocol/session.ts';
import type { SampledLogprob } from '../protocol/payload.ts';
import type { StageTiming, TelemetryEvent } from './telemetry.ts';

/** A session on a route as a TokenStepper: every step asks the stages for their timings. */
export class RouteStepper extends ClientStepper implements TimedStepper {
  private constructor(
    client: RouteSessionClient,
    contextLength: number,
    private readonly prefillChunk: number,
  ) {
    super(client, contextLength);
  }

  /** a session already open on the route (kept by an earlier generation), at `position` */
  static attach(link: FrameLink, routeId: number, sessionId: string, position: number, contextLength: number, prefillChunk = DEFAULT_PREFILL_CHUNK): RouteStepper {
    return new RouteStepper(RouteSessionClient.attach(link, routeId, sessionId, position), contextLength, prefillChunk);
  }

  /** opens a session on route `routeId` through `link` */
  static async open(link: FrameLink, routeId: number, body: SessionOpenBody, prefillChunk = DEFAULT_PREFILL_CHUNK): Promise<RouteStepper> {
    return new RouteStepper(await RouteSessionClient.open(link, routeId, body), body.contextLength, prefillChunk);
  }

  get lastLogprob(): SampledLogprob | null {
    return this.client.lastLogprob;
  }

  prefill(prompt: readonly number[], onProgress?: (done: number, total: number) => void): Promise<number> {
    return this.client.prefill(prompt, this.prefillChunk, onProgress);
  }

  decode(token: number): Promise<number> {
    return this.client.decode(token);
  }

  close(): Promise<void> {
    return this.client.close();
  }
}

export interface RouteGenerationRequest {
  promptTokens: readonly number[];
  maxTokens: number;
  sampler?: SamplerSettings;
  /** report each token's log-probability and this many top alternatives (token events carry them) */
  logprobs?: number;
  stopStrings?: readonly string[];
  contextLength?: number;
  prefillChunk?: number;
  signal?: AbortSignal;
  onDelta?: (text: string) => void;
  onEvent?: (e: TelemetryEvent) => void;
  /** called once the session id is known (e.g. to tie a client connection to it) */
  onSession?: (sessionId: string) => void;
  /** continue this idle session of the route instead of opening one: it keeps the prompt's first `position` tokens in its KV cache */
  reuse?: KeptSession & { position: number };
  /** leave the session open afterwards (its KV for reuse); the result says what it holds */
  keep?: boolean;
  /** speculative decoding's drafts per route pass (greedy sessions; 0 = off; absent: the server's default) */
  speculate?: number;
  /** sample here under this constraint (a grammar) from the last stage's logits, not on the last stage (constrained-stepper.ts) */
  constraint?: TokenConstraint;
}

/** A session left open on a route after a generation, and the tokens its KV cache holds. */
export interface KeptSession {
  sessionId: string;
  tokens: number[];
  contextLength: number;
}

export interface RouteGenerationResult extends GenerationResult {
  sessionId: string;
  summary: Extract<TelemetryEvent, { type: 'session_summary' }> | null;
  /** prompt tokens that came from a kept session's KV instead of a prefill */
  cachedTokens: number;
  /** with `keep`: the session left open */
  kept: KeptSession | null;
  /** the session's status read just before it ended (per-stage timings, each hop's carrier, bytes and wire time), when it answered */
  info: SessionInfo | null;
}

/**
 * One generation on route `routeId`, announced (session_opened), run by the loop, summed up
 * from the stages' own timings (session_summary) and closed; a failure is an `error` event
 * and a MeshError naming the stage where it can.
 */
export async function generateOnRoute(link: FrameLink, routeId: number, tokenizer: Tokenizer, req: RouteGenerationRequest): Promise<RouteGenerationResult> {
  const prompt = [...req.promptTokens];
  // the OpenAI API passes maxTokens already clamped to [0, n_ctx], so its check never fires there
  const contextLength = generationContextLength(prompt, req.maxTokens, req.contextLength);
  const emit = req.onEvent ?? (() => undefined);
  const penalties = !!req.sampler && usesPenalties(req.sampler);
  const reuse = !req.constraint && req.reuse && req.reuse.position < prompt.length && prompt.length + req.maxTokens <= req.reuse.contextLength ? req.reuse : null;
  let stepper: RouteStepper | ConstrainedStepper;
  if (req.constraint) {
    const client = await RouteSessionClient.open(link, routeId, { contextLength, promptLength: prompt.length });
    stepper = new ConstrainedStepper(client, contextLength, req.prefillChunk ?? DEFAULT_PREFILL_CHUNK, req.constraint, req.sampler ?? {}, req.logprobs ?? null);
  } else if (reuse) {
    stepper = RouteStepper.attach(link, routeId, reuse.sessionId, reuse.tokens.length, reuse.contextLength, req.prefillChunk);
    // the last stage's penalties need every prompt id, from 0
    await stepper.client.rewind(reuse.position, { draws: 0, sampler: req.sampler ?? {}, logprobs: req.logprobs ?? null, ...(penalties ? { tokens: prompt, from: 0 } : {}) });
  } else {
    const body: SessionOpenBody = {
      contextLength,
      promptLength: prompt.length,
      ...(req.sampler ? { sampler: req.sampler } : {}),
      // the last stage sees hidden states, not tokens: penalties need the prompt's ids
      ...(penalties ? { tokens: prompt } : {}),
      ...(req.logprobs !== undefined ? { logprobs: req.logprobs } : {}),
      ...(req.speculate !== undefined ? { speculate: req.speculate } : {}),
      // the next step waits on stage 0 for the last stage's token, where the route takes the ring
      tokenPath: 'ring',
    };
    stepper = await RouteStepper.open(link, routeId, body, req.prefillChunk);
  }
  const cached = reuse ? reuse.position : 0;
  const sessionId = stepper.sessionId;
  req.onSession?.(sessionId);
  emit({ type: 'session_opened', sessionId, routeId });
  let summary: RouteGenerationResult['summary'] = null;
  let keep = false;
  try {
    const out = await runGeneration(stepper, tokenizer, prompt.slice(cached), { ...req, onEvent: emit, sessionId });
    const info = await stepper.client.info().catch(() => null);
    if (info) summary = summarize(info, out.promptMs, prompt.length - cached, out.decodeMs, out.decodeSteps, out.tokens.length);
    if (summary) emit(summary);
    // the KV holds the prompt and every generated token but the last (never fed back)
    const held = [...prompt, ...out.tokens.slice(0, Math.max(0, out.tokens.length - 1))];
    keep = !!req.keep && !req.constraint && out.stopReason !== 'aborted' && held.length === stepper.position;
    if (!keep) await stepper.close();
    return { ...out.result(prompt), sessionId, summary, cachedTokens: cached, kept: keep ? { sessionId, tokens: held, contextLength: stepper.contextLength } : null, info };
  } catch (e) {
    const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
    emit({ type: 'error', sessionId, code: err.code, message: err.message, ...(typeof err.details?.stage === 'number' ? { stage: err.details.stage } : {}) });
    throw err;
  } finally {
    if (!keep) await stepper.close().catch(() => undefined);
  }
}


function summarize(info: SessionInfo, promptMs: number, promptTokens: number, decodeMs: number, decodeSteps: number, generated: number): Extract<TelemetryEvent, { type: 'session_summary' }> {
  const stages = info.stages.map((s) => s.timing as StageTiming | undefined).filter((t): t is StageTiming => t !== undefined);
  const steps = Math.max(1, promptTokens + decodeSteps);
  return {
    type: 'session_summary',
    sessionId: info.sessionId,
    promptTokens,
    generatedTokens: generated,
    timeToFirstTokenMs: Math.round(promptMs * 1000) / 1000,
    promptTokS: promptMs > 0 ? Math.round((promptTokens * 1e6) / promptMs) / 1000 : 0,
    decodeTokS: decodeMs > 0 ? Math.round((decodeSteps * 1e6) / decodeMs) / 1000 : 0,
    // bytes sent per processed token on each hop (prefill rows and decode rows alike)
    bytesPerHop: stages.slice(0, -1).map((t) => Math.round((t.bytesOut / steps) * 10) / 10),
    stages,
    ...(info.speculation ? { speculation: info.speculation } : {}),
    ...(info.ring ? { ring: info.ring } : {}),
  };
}
