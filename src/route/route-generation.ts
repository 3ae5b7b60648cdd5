// Generation where the route samples: the prompt goes to stage 0 in chunks, the last stage
// samples each token (temperature, top-p, seed travel in the session's open frame), and this
// loop only decodes text, watches for end-of-generation and stop strings, and reports
// telemetry. The signaling server's OpenAI-compatible API runs on it.

import { MeshError } from '../errors.ts';
import type { Tokenizer } from '../model/tokenizer/tokenizer.ts';
import type { FrameLink } from '../transport/link.ts';
import { RouteSessionClient } from './client.ts';
import { generationContextLength } from './generation.ts';
import { GenerationOutput } from '../model/generation-output.ts';
import type { GenerationResult } from '../model/generation-output.ts';
import type { SessionInfo } from './sessions.ts';
import type { SamplerSettings } from '../protocol/session.ts';
import { stepBreakdown } from './telemetry.ts';
import type { StageTiming, TelemetryEvent } from './telemetry.ts';

export interface RouteGenerationRequest {
  promptTokens: readonly number[];
  maxTokens: number;
  sampler?: SamplerSettings;
  stopStrings?: readonly string[];
  contextLength?: number;
  prefillChunk?: number;
  signal?: AbortSignal;
  onDelta?: (text: string) => void;
  onEvent?: (e: TelemetryEvent) => void;
  /** called once the session id is known (e.g. to tie a client connection to it) */
  onSession?: (sessionId: string) => void;
}

export interface RouteGenerationResult extends GenerationResult {
  sessionId: string;
  summary: Extract<TelemetryEvent, { type: 'session_summary' }> | null;
}

export async function generateOnRoute(link: FrameLink, routeId: number, tokenizer: Tokenizer, req: RouteGenerationRequest): Promise<RouteGenerationResult> {
  const prompt = [...req.promptTokens];
  // the OpenAI API passes maxTokens already clamped to [0, n_ctx], so its check never fires there
  const contextLength = generationContextLength(prompt, req.maxTokens, req.contextLength);
  const emit = req.onEvent ?? (() => undefined);
  const client = await RouteSessionClient.open(link, routeId, { contextLength, promptLength: prompt.length, ...(req.sampler ? { sampler: req.sampler } : {}) });
  const sessionId = client.sessionId;
  client.wantTimings = true;
  req.onSession?.(sessionId);
  emit({ type: 'session_opened', sessionId, routeId });
  const out = new GenerationOutput(tokenizer, req.stopStrings, req.onDelta);
  const { text, decoder, tokens } = out;
  let summary: RouteGenerationResult['summary'] = null;
  let closed = false;
  try {
    const t0 = performance.now();
    let token = await client.prefill(prompt, req.prefillChunk ?? 64, (done, total) => emit({ type: 'prefill_progress', sessionId, tokensDone: done, tokensTotal: total }));
    out.promptMs = performance.now() - t0;
    while (req.maxTokens > 0) {
      tokens.push(token);
      const piece = decoder.push(token);
      // the step that produced this token, stage by stage (the last stage's reply carried it)
      if (client.lastTimings.length) emit({ type: 'step_timing', sessionId, position: client.lastTimings[0]!.position, stages: stepBreakdown(client.lastTimings) });
      emit({ type: 'token', sessionId, id: token, text: piece, position: client.position });
      if (tokenizer.isEog(token)) {
        out.stopReason = 'eog';
        break;
      }
      if (text.push(piece)) {
        out.stopReason = 'stop_string';
        break;
      }
      if (tokens.length >= req.maxTokens) break;
      if (client.position >= contextLength) {
        out.stopReason = 'context_full';
        break;
      }
      if (req.signal?.aborted) {
        out.stopReason = 'aborted';
        break;
      }
      const t1 = performance.now();
      token = await client.decode(token);
      out.decodeMs += performance.now() - t1;
      out.decodeSteps++;
    }
    out.finish();
    const info = await client.info().catch(() => null);
    if (info) summary = summarize(info, out.promptMs, prompt.length, out.decodeMs, out.decodeSteps, tokens.length);
    if (summary) emit(summary);
    await client.close();
    closed = true;
  } catch (e) {
    const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
    emit({ type: 'error', sessionId, code: err.code, message: err.message, ...(typeof err.details?.stage === 'number' ? { stage: err.details.stage } : {}) });
    throw err;
  } finally {
    if (!closed) await client.close().catch(() => undefined);
  }
  return { ...out.result(prompt), sessionId, summary };
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
  };
}
