// Chat generation from the page, straight over the room's route: the prompt is rendered with
// the model's own chat template and tokenised here (the tokenizer comes from the GGUF header,
// read by Range through the server), then the route runs it — prefill in chunks, one decode
// frame per token, sampling on the last stage — through the same generation loop as every
// other client (route/generation-loop.ts over a RouteStepper), and text deltas stream as tokens
// arrive. The frames go over HTTP (POST /v1/sessions/…), the carrier a browser can
// authenticate with the room secret; the server forwards them to stage 0.

import { MeshError } from '../errors.ts';
import { readHeader } from '../gguf/parse.ts';
import { ChatTemplate } from '../model/chat-template.ts';
import type { ChatMessage } from '../model/chat-template.ts';
import type { StopReason } from '../model/generation-output.ts';
import { Tokenizer } from '../model/tokenizer/tokenizer.ts';
import type { SessionOpenBody } from '../protocol/session.ts';
import { runGeneration } from '../route/generation-loop.ts';
import { RouteStepper } from '../route/route-generation.ts';
import type { StepStageTiming, TelemetryEvent } from '../route/telemetry.ts';
import { HttpLink } from '../transport/http.ts';
import type { RoomLink } from './room-api.ts';
import { fetchRoom } from './room-api.ts';

export type { ChatMessage };

export interface SamplerChoice {
  /** 0 = greedy */
  temperature: number;
  topK: number;
  topP: number;
  seed: number;
  maxTokens: number;
}

export const DEFAULT_SAMPLER: SamplerChoice = { temperature: 0, topK: 40, topP: 0.95, seed: 1, maxTokens: 64 };

export interface GenerationStats {
  promptTokens: number;
  generatedTokens: number;
  /** request sent → first token back (ms) */
  ttftMs: number;
  /** decode steps per second (after the first token) */
  tokPerS: number;
  /** wall time of each decode step (ms) */
  stepMs: number[];
  /** per stage, averaged over the decode steps: compute, transfer, queue (ms) and bytes out per token */
  stages: StepStageTiming[];
  stopReason: StopReason;
  /** the prompt exactly as the model saw it (chat template applied) */
  promptText: string;
}

export interface ChatEvents {
  onToken?: (delta: string, tokenId: number) => void;
  /** prefill chunks done / total, before the first token */
  onPrefill?: (done: number, total: number) => void;
  /** each step's per-stage breakdown, from the timing trailer the stages append to the reply */
  onStep?: (stages: StepStageTiming[], step: { position: number; prefill: boolean }) => void;
}

/** Per-stage means of decode-step breakdowns. */
function meanBreakdown(steps: StepStageTiming[][]): StepStageTiming[] {
  if (steps.length === 0) return [];
  const n = steps.length;
  return steps[0]!.map((first, i) => {
    const col = steps.map((s) => s[i] ?? first);
    const mean = (k: keyof StepStageTiming): number => col.reduce((a, s) => a + s[k], 0) / n;
    return { stage: first.stage, computeMs: mean('computeMs'), transferMs: mean('transferMs'), queueMs: mean('queueMs'), overheadMs: mean('overheadMs'), bytesIn: mean('bytesIn'), bytesOut: mean('bytesOut') };
  });
}

/** Model pieces a chat needs, read once per room. */
export interface ChatModel {
  modelId: string;
  tokenizer: Tokenizer;
  template: ChatTemplate;
  contextLength: number;
}

export async function loadChatModel(link: RoomLink): Promise<ChatModel> {
  const room = await fetchRoom(link);
  const url = room.model.url;
  // the room's own hosting wants the secret; a public URL (a model hub) must not receive it
  const sameServer = new URL(url, link.base).origin === new URL(link.base).origin;
  const header = await readHeader(url, sameServer ? { headers: { authorization: `Bearer ${link.secret}` } } : {});
  const tokenizer = Tokenizer.fromMetadata(header.metadata);
  const template = ChatTemplate.fromMetadata(header.metadata, { tokenizer, fallback: true });
  const arch = String(header.metadata['general.architecture'] ?? 'llama');
  const ctx = Number(header.metadata[`${arch}.context_length`] ?? 2048);
  return { modelId: room.model.id, tokenizer, template, contextLength: Number.isFinite(ctx) && ctx > 0 ? ctx : 2048 };
}

/** The route id of a room once it is ready (ROUTE_NOT_READY otherwise, with the reason). */
async function readyRoute(link: RoomLink): Promise<number> {
  const room = await fetchRoom(link);
  if (!room.route || room.route.status !== 'ready') {
    throw new MeshError('ROUTE_NOT_READY', `the route is ${room.route ? room.route.status : 'not planned yet'}${room.route?.reason ? `: ${room.route.reason}` : ''} — wait for peers to join and load`);
  }
  return room.route.id;
}

/**
 * Generates the assistant's reply to `messages` over the room's route, streaming deltas.
 * Aborting `signal` stops after the step in flight and closes the session (freeing every
 * stage's KV cache).
 */
export async function chatOverRoute(link: RoomLink, model: ChatModel, messages: readonly ChatMessage[], sampler: SamplerChoice, events: ChatEvents = {}, signal?: AbortSignal): Promise<{ text: string; stats: GenerationStats }> {
  const promptText = model.template.prompt(model.tokenizer, messages);
  const prompt = model.tokenizer.encode(promptText);
  const contextLength = Math.min(model.contextLength, prompt.length + sampler.maxTokens);
  if (prompt.length >= model.contextLength) throw new MeshError('CONTEXT_FULL', `the conversation has ${prompt.length} tokens, the model's context is ${model.contextLength}`);
  const routeId = await readyRoute(link);
  const httpLink = new HttpLink(link.base, { authorization: `Bearer ${link.secret}` });
  const open: SessionOpenBody = { contextLength, sampler: sampler.temperature > 0 ? { temperature: sampler.temperature, topK: sampler.topK, topP: sampler.topP, seed: sampler.seed } : { temperature: 0 } };
  const decodeSteps: StepStageTiming[][] = [];
  let lastToken = -1;
  const onEvent = (e: TelemetryEvent): void => {
    if (e.type === 'prefill_progress') events.onPrefill?.(e.tokensDone, e.tokensTotal ?? prompt.length);
    else if (e.type === 'token') lastToken = e.id;
    else if (e.type === 'step_timing') {
      // the prefill's reply is the one for a position inside the prompt
      const prefill = e.position < prompt.length;
      if (!prefill) decodeSteps.push(e.stages);
      events.onStep?.(e.stages, { position: e.position, prefill });
    }
  };

  const t0 = performance.now();
  const stepper = await RouteStepper.open(httpLink, routeId, open);
  const openMs = performance.now() - t0;
  try {
    const out = await runGeneration(stepper, model.tokenizer, prompt, { maxTokens: sampler.maxTokens, onDelta: (delta) => events.onToken?.(delta, lastToken), onEvent, ...(signal ? { signal } : {}) });
    return {
      text: out.text.text,
      stats: {
        promptTokens: prompt.length,
        generatedTokens: out.tokens.length,
        ttftMs: openMs + out.promptMs,
        tokPerS: out.decodeMs > 0 ? (out.decodeSteps * 1000) / out.decodeMs : 0,
        stepMs: out.stepMs,
        stages: meanBreakdown(decodeSteps),
        stopReason: out.stopReason,
        promptText,
      },
    };
  } finally {
    await stepper.close().catch(() => undefined);
  }
}
