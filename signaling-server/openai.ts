// An OpenAI-compatible API over a room's route: POST /v1/chat/completions, POST
// /v1/completions (streamed as Server-Sent Events in OpenAI's chunk format, ending with
// `data: [DONE]`) and GET /v1/models. The model name is the room's model id (or room id); the
// API key is the room secret. Before the first token, chunks carry route and prefill progress
// in an extension field, `gguf_mesh`, which OpenAI clients ignore. A failure mid-stream is an
// SSE `error` event naming the stage; a client that goes away cancels the session, which
// frees the KV cache on every stage.

import type { IncomingMessage, ServerResponse } from 'node:http';
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
import type { Room } from './room.ts';

const MAX_BODY_BYTES = 4 * 1024 * 1024;
/** how long a streamed request waits for a forming/loading route (ms) */
const ROUTE_WAIT_MS = 120_000;

interface CompletionBody {
  model?: string;
  prompt?: string | string[];
  messages?: Array<{ role: string; content: string | Array<{ type: string; text?: string }> }>;
  max_tokens?: number;
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  seed?: number;
  stop?: string | string[];
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
}

export interface OpenAiContext {
  sessions: SessionManager;
}

const tokenizers = new WeakMap<Room, Tokenizer>();
function tokenizerOf(room: Room): Tokenizer {
  let t = tokenizers.get(room);
  if (!t) tokenizers.set(room, (t = Tokenizer.fromMetadata(room.model.header.metadata)));
  return t;
}

function openAiError(res: ServerResponse, e: unknown): void {
  const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
  sendJson(res, httpStatusFor(err.code), {
    error: { message: err.message, type: err.code === 'AUTH_FAILED' ? 'authentication_error' : 'invalid_request_error', code: err.code, ...err.details },
  });
}

async function readCompletionBody(req: IncomingMessage): Promise<CompletionBody> {
  const body = await readJsonBody(req, MAX_BODY_BYTES, 'an OpenAI request object');
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new MeshError('BAD_REQUEST', 'the request body must be a JSON object');
  return body as CompletionBody;
}

function pickRoom(body: CompletionBody, allowed: Room[]): Room {
  const room = body.model ? allowed.find((r) => r.model.id === body.model || r.id === body.model) : allowed.length === 1 ? allowed[0] : undefined;
  if (!room) throw new MeshError('NOT_FOUND', `no model '${body.model ?? ''}' in the rooms this key opens (models: ${allowed.map((r) => r.model.id).join(', ')})`);
  return room;
}

function num(v: unknown, name: string, lo: number, hi: number, fallback: number): number {
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || v > hi) throw new MeshError('BAD_REQUEST', `${name} must be a number in [${lo}, ${hi}], got ${JSON.stringify(v)}`);
  return v;
}

function messageText(content: string | Array<{ type: string; text?: string }>): string {
  return typeof content === 'string' ? content : content.filter((p) => p.type === 'text').map((p) => p.text ?? '').join('');
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
  try {
    const body = await readCompletionBody(req);
    const room = pickRoom(body, allowed);
    const tokenizer = tokenizerOf(room);
    let promptText: string;
    if (chat) {
      if (!Array.isArray(body.messages) || body.messages.length === 0) throw new MeshError('BAD_REQUEST', 'messages must be a non-empty array');
      const messages: ChatMessage[] = body.messages.map((m) => ({ role: String(m.role), content: messageText(m.content) }));
      promptText = ChatTemplate.fromMetadata(room.model.header.metadata, { tokenizer, fallback: true }).prompt(tokenizer, messages);
    } else {
      if (typeof body.prompt !== 'string' && !(Array.isArray(body.prompt) && body.prompt.length === 1)) throw new MeshError('BAD_REQUEST', 'prompt must be a string');
      promptText = Array.isArray(body.prompt) ? String(body.prompt[0]) : body.prompt;
    }
    const promptTokens = tokenizer.encode(promptText);
    const nCtx = hyperParameters(room.model.header).n_ctx_train || 2048; // as configFromHeader defaults it
    const maxTokens = Math.floor(num(body.max_completion_tokens ?? body.max_tokens, 'max_tokens', 0, nCtx, chat ? Math.max(0, Math.min(512, nCtx - promptTokens.length)) : 16));
    const temperature = num(body.temperature, 'temperature', 0, 2, 1);
    const topP = num(body.top_p, 'top_p', Number.MIN_VALUE, 1, 1);
    const seed = body.seed === undefined ? undefined : Math.floor(num(body.seed, 'seed', -(2 ** 53), 2 ** 53, 0)) >>> 0;
    const stop = body.stop === undefined || body.stop === null ? [] : Array.isArray(body.stop) ? body.stop.map(String) : [String(body.stop)];
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomBytes(12).toString('hex')}`;
    const created = Math.floor(Date.now() / 1000);
    const model = room.model.id;
    const usage = (r: RouteGenerationResult) => ({ prompt_tokens: r.promptTokens.length, completion_tokens: r.tokens.length, total_tokens: r.promptTokens.length + r.tokens.length });
    const finish = (r: RouteGenerationResult) => (r.stopReason === 'max_tokens' || r.stopReason === 'context_full' ? 'length' : 'stop');
    const abort = new AbortController();
    let sessionId: string | null = null;
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
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
    const link = new LocalLink((f) => ctx.sessions.handle(f, req));
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
  }
  return true;
}
