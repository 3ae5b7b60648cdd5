// An OpenAI-compatible API over a room's route: POST /v1/chat/completions, POST
// /v1/completions (streamed as Server-Sent Events in OpenAI's chunk format, ending with
// `data: [DONE]`) and GET /v1/models. The model name is the room's model id (or room id); the
// API key is the room secret. Before the first token, chunks carry route and prefill progress
// in an extension field, `gguf_mesh`, which OpenAI clients ignore. A failure mid-stream is an
// SSE `error` event naming the stage; a client that goes away cancels the session, which
// frees the KV cache on every stage.

import type { IncomingMessage, ServerResponse } from 'node:http';
import * as v from 'valibot';
import { randomBytes } from 'node:crypto';
import { httpStatusFor, MeshError } from '../src/errors.ts';
import { ChatTemplate } from '../src/model/chat-template.ts';
import type { ChatMessage } from '../src/model/chat-template.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { hyperParameters } from '../src/gguf/summary.ts';
import { generateOnRoute } from '../src/route/route-generation.ts';
import type { RouteGenerationResult } from '../src/route/route-generation.ts';
import type { SessionManager } from '../src/route/sessions.ts';
import type { TelemetryEvent } from '../src/route/telemetry.ts';
import { LocalLink } from '../src/transport/link.ts';
import { readJsonBody, sendJson } from '../src/transport/http.ts';
import { list, text, validate } from '../src/protocol/validate.ts';
import type { AdmissionGate } from './admission.ts';
import type { Room } from './room.ts';

const MAX_BODY_BYTES = 4 * 1024 * 1024;
/** how long a streamed request waits for a forming/loading route (ms) */
const ROUTE_WAIT_MS = 120_000;

const part = v.object({ type: text(64), text: v.optional(v.string()) });
const chatMessage = v.object({ role: text(64), content: v.union([v.string(), list(part, 1024), v.null()]) });
const maxTokens = v.nullish(v.pipe(v.number(), v.integer(), v.minValue(0)));
/** An OpenAI completion or chat request; unknown fields are ignored, as OpenAI's own API does for most. */
const completionSchema = v.object({
  model: v.optional(text(256)),
  prompt: v.optional(v.union([v.string(), v.tuple([v.string()])])),
  messages: v.optional(v.pipe(list(chatMessage, 10_000), v.minLength(1))),
  max_tokens: maxTokens,
  max_completion_tokens: maxTokens,
  temperature: v.nullish(v.pipe(v.number(), v.finite(), v.minValue(0), v.maxValue(2))),
  top_p: v.nullish(v.pipe(v.number(), v.finite(), v.gtValue(0), v.maxValue(1))),
  seed: v.nullish(v.pipe(v.number(), v.integer(), v.minValue(-(2 ** 53)), v.maxValue(2 ** 53))),
  stop: v.nullish(v.union([v.string(), list(v.string(), 4)])),
  stream: v.nullish(v.boolean()),
  stream_options: v.nullish(v.object({ include_usage: v.optional(v.boolean()) })),
});
type CompletionBody = v.InferOutput<typeof completionSchema>;

export interface OpenAiContext {
  sessions: SessionManager;
  /** admission control: beyond its queue, 429 QUEUE_FULL with Retry-After */
  gate: AdmissionGate;
  /** who is asking (an API key's id), the owner of the session it opens */
  principal?: string | null;
}

const tokenizers = new WeakMap<Room, Tokenizer>();
function tokenizerOf(room: Room): Tokenizer {
  let t = tokenizers.get(room);
  if (!t) tokenizers.set(room, (t = Tokenizer.fromMetadata(room.model.header.metadata)));
  return t;
}

/** OpenAI's error shape: `param` names the field, `code` is OpenAI's where it has one (context_length_exceeded). */
function openAiError(res: ServerResponse, e: unknown): void {
  const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
  const status = httpStatusFor(err.code);
  const type = err.code === 'AUTH_FAILED' ? 'authentication_error' : status === 429 ? 'rate_limit_error' : status >= 500 ? 'server_error' : 'invalid_request_error';
  const { field, ...details } = err.details ?? {};
  if (typeof details.retryAfterS === 'number') res.setHeader('retry-after', String(details.retryAfterS));
  sendJson(res, status, {
    error: { message: err.message, type, param: typeof field === 'string' ? field : null, code: err.code === 'CONTEXT_LENGTH_EXCEEDED' ? 'context_length_exceeded' : err.code, ...details },
  });
}

async function readCompletionBody(req: IncomingMessage): Promise<CompletionBody> {
  const body = await readJsonBody(req, MAX_BODY_BYTES, 'an OpenAI request object');
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new MeshError('BAD_REQUEST', 'the request body must be a JSON object', { field: '(whole)' });
  return validate(completionSchema, body, 'request body', 'BAD_REQUEST');
}

function pickRoom(body: CompletionBody, allowed: Room[]): Room {
  const room = body.model ? allowed.find((r) => r.model.id === body.model || r.id === body.model) : allowed.length === 1 ? allowed[0] : undefined;
  if (!room) throw new MeshError('NOT_FOUND', `no model '${body.model ?? ''}' in the rooms this key opens (models: ${allowed.map((r) => r.model.id).join(', ')})`);
  return room;
}

function messageText(content: string | Array<{ type: string; text?: string | undefined }> | null): string {
  if (content === null) return '';
  return typeof content === 'string' ? content : content.filter((p) => p.type === 'text').map((p) => p.text ?? '').join('');
}

/** What the loop needs from a request: its prompt tokens and settings, checked against the model's context. */
function generationRequest(room: Room, body: CompletionBody, chat: boolean) {
  const tokenizer = tokenizerOf(room);
  let promptText: string;
  if (chat) {
    if (!body.messages) throw new MeshError('BAD_REQUEST', 'request body: messages: a chat completion needs a non-empty array of messages', { field: 'messages' });
    const messages: ChatMessage[] = body.messages.map((m) => ({ role: m.role, content: messageText(m.content) }));
    promptText = ChatTemplate.fromMetadata(room.model.header.metadata, { tokenizer, fallback: true }).prompt(tokenizer, messages);
  } else {
    if (body.prompt === undefined) throw new MeshError('BAD_REQUEST', 'request body: prompt: a completion needs a prompt string', { field: 'prompt' });
    promptText = typeof body.prompt === 'string' ? body.prompt : body.prompt[0];
  }
  const promptTokens = tokenizer.encode(promptText);
  const nCtx = hyperParameters(room.model.header).n_ctx_train || 2048; // as configFromHeader defaults it
  const asked = body.max_completion_tokens ?? body.max_tokens;
  const maxTokens = asked ?? (chat ? Math.max(0, Math.min(512, nCtx - promptTokens.length)) : Math.min(16, Math.max(0, nCtx - promptTokens.length)));
  // OpenAI's rule: the prompt and the completion must fit the context, or the request is a 400
  if (promptTokens.length + Math.max(1, maxTokens) > nCtx) {
    throw new MeshError(
      'CONTEXT_LENGTH_EXCEEDED',
      `This model's maximum context length is ${nCtx} tokens. However, you requested ${promptTokens.length + maxTokens} tokens (${promptTokens.length} in the ${chat ? 'messages' : 'prompt'}, ${maxTokens} for the completion). Please reduce the length of the ${chat ? 'messages' : 'prompt'} or completion.`,
      { field: chat ? 'messages' : 'prompt', promptTokens: promptTokens.length, maxTokens, contextLength: nCtx },
    );
  }
  const seed = body.seed === undefined || body.seed === null ? undefined : Math.floor(body.seed) >>> 0;
  const stop = body.stop === undefined || body.stop === null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop];
  return { tokenizer, promptTokens, maxTokens, temperature: body.temperature ?? 1, topP: body.top_p ?? 1, seed, stop };
}

export function modelsList(allowed: Room[]): unknown {
  return {
    object: 'list',
    data: allowed.map((r) => ({ id: r.model.id, object: 'model', created: 0, owned_by: 'gguf-mesh', room: r.id, route_status: r.route?.status ?? 'forming' })),
  };
}

/** Handles the OpenAI paths; false when the path is not one of them. */
export async function handleOpenAi(req: IncomingMessage, res: ServerResponse, allowed: Room[], ctx: OpenAiContext): Promise<boolean> {
  const path = new URL(req.url ?? '/', 'http://x').pathname;
  if (req.method === 'GET' && path === '/v1/models') {
    sendJson(res, 200, modelsList(allowed));
    return true;
  }
  const chat = path === '/v1/chat/completions';
  if (req.method !== 'POST' || (!chat && path !== '/v1/completions')) return false;
  let streaming = false;
  let stopLoading: (() => void) | null = null;
  let leave: (() => void) | null = null;
  try {
    const body = await readCompletionBody(req);
    const room = pickRoom(body, allowed);
    const { tokenizer, promptTokens, maxTokens, temperature, topP, seed, stop } = generationRequest(room, body, chat);
    // a turn among the running generations, or a place in the bounded queue, or 429 now
    const queued = new AbortController();
    res.once('close', () => queued.abort());
    leave = await ctx.gate.enter(queued.signal);
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomBytes(12).toString('hex')}`;
    const created = Math.floor(Date.now() / 1000);
    const model = room.model.id;
    const usage = (r: RouteGenerationResult) => ({ prompt_tokens: r.promptTokens.length, completion_tokens: r.tokens.length, total_tokens: r.promptTokens.length + r.tokens.length });
    const finish = (r: RouteGenerationResult) => (r.stopReason === 'max_tokens' || r.stopReason === 'context_full' ? 'length' : 'stop');
    const abort = new AbortController();
    let sessionId: string | null = null;
    // a client that goes away cancels its session on every stage at once, mid-prefill too:
    // each stage drops its queued chunks and stops after the one computing
    res.on('close', () => {
      if (res.writableFinished) return;
      abort.abort();
      void ctx.sessions.ownerGone(req);
    });

    const chunk = (delta: Record<string, unknown> | string, finishReason: string | null, extra: Record<string, unknown> = {}): unknown =>
      chat
        ? { id, object: 'chat.completion.chunk', created, model, choices: [{ index: 0, delta: typeof delta === 'string' ? { content: delta } : delta, logprobs: null, finish_reason: finishReason }], ...extra }
        : { id, object: 'text_completion', created, model, choices: [{ index: 0, text: typeof delta === 'string' ? delta : '', logprobs: null, finish_reason: finishReason }], ...extra };
    const sse = (data: unknown, event?: string): void => {
      if (!res.writableEnded) res.write(`${event ? `event: ${event}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
    };

    if (body.stream) {
      streaming = true;
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
      if (chat) sse(chunk({ role: 'assistant', content: '' }, null));
    }
    const progress = (e: TelemetryEvent): void => {
      if (streaming) sse(chunk(chat ? {} : '', null, { gguf_mesh: e }));
    };
    // a route still forming or loading: report it (and its stages' loading progress), then wait (streamed requests only)
    const deadline = Date.now() + (streaming ? ROUTE_WAIT_MS : 0);
    if (room.route?.status !== 'ready') stopLoading = room.subscribe((e) => e.type === 'stage_loading' && progress(e));
    for (let last = ''; room.route?.status !== 'ready'; ) {
      const r = room.route;
      const state = r ? `${r.status}:${r.reason ?? ''}:${r.stages.map((s) => s.status).join(',')}` : 'none';
      if (state !== last) {
        last = state;
        progress({ type: 'route_status', routeId: r?.id ?? 0, status: r?.status ?? 'forming', reason: r?.reason ?? 'no peers yet' });
      }
      if (Date.now() >= deadline || abort.signal.aborted) throw new MeshError('ROUTE_NOT_READY', `model ${model}: route is ${r?.status ?? 'not planned'}${r?.reason ? ` (${r.reason})` : ''}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    stopLoading?.();
    stopLoading = null;
    const route = room.route!;
    progress({ type: 'route_planned', routeId: route.id, stages: route.stages.map((s) => ({ stage: s.stage, peerId: s.peerId, start: s.shard.start, end: s.shard.end })) });
    const link = new LocalLink((f) => ctx.sessions.handle(f, req, ctx.principal ?? null));
    let unsubscribe: (() => void) | null = null;
    let firstToken = false;
    let lastStep: TelemetryEvent | null = null;
    const repairs: TelemetryEvent[] = [];
    const result = await generateOnRoute(link, route.id, tokenizer, {
      promptTokens,
      maxTokens,
      sampler: { temperature, topP, ...(seed !== undefined ? { seed } : {}) },
      stopStrings: stop,
      signal: abort.signal,
      onSession: (sid) => {
        sessionId = sid;
        // progress from the session manager (prefill per chunk) reaches the stream too
        unsubscribe = ctx.sessions.subscribe(sid, (e) => {
          if (!firstToken && e.type === 'prefill_progress') progress(e);
          // a stage lost and the route repaired under the session: the client sees it happen, but no error
          if (e.type === 'stage_lost' || e.type === 'route_repairing' || e.type === 'route_repaired') {
            repairs.push(e);
            progress(e);
          }
        });
      },
      onEvent: (e) => {
        if (e.type === 'token') firstToken = true;
        if (e.type === 'step_timing') lastStep = e;
        if (sessionId && (e.type === 'token' || e.type === 'step_timing' || e.type === 'session_summary')) ctx.sessions.publish(sessionId, e);
      },
      // each content chunk carries the per-stage breakdown of the step that produced it
      ...(streaming ? { onDelta: (d: string) => d && sse(chunk(d, null, lastStep ? { gguf_mesh: lastStep } : {})) } : {}),
    }).finally(() => (unsubscribe as (() => void) | null)?.());
    if (streaming) {
      sse(chunk(chat ? {} : '', finish(result), { gguf_mesh: result.summary }));
      if (body.stream_options?.include_usage) sse(chat ? { id, object: 'chat.completion.chunk', created, model, choices: [], usage: usage(result) } : { id, object: 'text_completion', created, model, choices: [], usage: usage(result) });
      sse('[DONE]');
      res.end();
    } else {
      sendJson(res, 200, {
        id,
        object: chat ? 'chat.completion' : 'text_completion',
        created,
        model,
        choices: [chat ? { index: 0, message: { role: 'assistant', content: result.text }, logprobs: null, finish_reason: finish(result) } : { index: 0, text: result.text, logprobs: null, finish_reason: finish(result) }],
        usage: usage(result),
        gguf_mesh: { session_id: result.sessionId, summary: result.summary, ...(repairs.length ? { repairs } : {}) },
      });
    }
  } catch (e) {
    (stopLoading as (() => void) | null)?.();
    const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
    if (streaming) {
      if (!res.writableEnded) {
        res.write(`event: error\ndata: ${JSON.stringify({ error: { message: err.message, type: 'server_error', code: err.code, ...err.details } })}\n\n`);
        res.end();
      }
    } else if (!res.headersSent) openAiError(res, err);
    else res.destroy();
  } finally {
    (leave as (() => void) | null)?.();
  }
  return true;
}
