// An OpenAI-compatible API over a room's route: POST /v1/chat/completions, POST
// /v1/completions (streamed as Server-Sent Events in OpenAI's chunk format, ending with
// `data: [DONE]`) and GET /v1/models. The model name is the room's model id (or room id); the
// API key is the room secret. Before the first token, chunks carry route and prefill progress
// in an extension field, `gguf_mesh`, which OpenAI clients ignore. A failure mid-stream is an
// SSE `error` event naming the stage; a client that goes away cancels the session, which
// frees the KV cache on every stage. Every request field is honoured or refused by name
// (openai-request.ts); `n` choices run as n sessions on the route at once, choice i seeded
// with seed + i; log-probabilities come from the last stage with each token. With tools, calls
// are read from the reply as it streams (tool-call-reader.ts) and go out as tool_calls deltas.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { randomBytes } from 'node:crypto';
import { httpStatusFor, MeshError } from '../src/errors.ts';
import { ChatTemplate } from '../src/model/chat-template.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { hyperParameters } from '../src/gguf/summary.ts';
import { generateOnRoute } from '../src/route/route-generation.ts';
import type { RouteGenerationResult } from '../src/route/route-generation.ts';
import type { SampledLogprob } from '../src/protocol/payload.ts';
import type { SessionManager } from '../src/route/sessions.ts';
import type { TelemetryEvent } from '../src/route/telemetry.ts';
import { LocalLink } from '../src/transport/link.ts';
import { readJsonBody, sendJson, SSE_HEAD } from '../src/transport/http.ts';
import type { AdmissionGate } from './admission.ts';
import type { Room } from './room.ts';
import { badParam, choiceSampler, messageText, parseRequest } from './openai-request.ts';
import { forcedCallFormat, templateMessage, templateTools, toolFormatOf, toolReader, toolsOf } from './openai-tools.ts';
import type { ToolCall, ToolChoice, ToolFormat, ToolSpec } from './openai-tools.ts';
import type { ToolEvent } from './tool-call-reader.ts';
import type { ChatMessage } from '../src/model/chat-template.ts';
import type { ParsedRequest } from './openai-request.ts';
import { chatLogprobs, completionLogprobs, toolDelta } from './openai-format.ts';
import { PrefixCache } from '../src/route/prefix-cache.ts';
import { controlEscaper, outputConstraint } from './structured-output.ts';
import { reproducible } from './resumable-completion.ts';
import { bodyDigest, pieceOf, StreamJournal } from './stream-journal.ts';
import type { JournalStore } from './stream-journal.ts';

const MAX_BODY_BYTES = 4 * 1024 * 1024;
/** positions a kept session reserves beyond its request, so that the next chat turn fits in its KV cache */
const KEEP_HEADROOM = 512;
/** a kept session that has gone (expired, its route re-planned): the request opens a fresh one */
const STALE_SESSION = new Set(['SESSION_UNKNOWN', 'SESSION_CLOSED', 'SESSION_BAD_STATE', 'POSITION_MISMATCH', 'FRAME_BAD_ROUTE']);
/** how long a streamed request waits for a forming/loading route (ms) */
const ROUTE_WAIT_MS = 120_000;

export interface OpenAiContext {
  sessions: SessionManager;
  /** admission control: beyond its queue, 429 QUEUE_FULL with Retry-After */
  gate: AdmissionGate;
  /** who is asking (an API key's id), the owner of the session it opens */
  principal?: string | null;
  /** where a stream sent to this client is journaled for a reconnect (serve --redis; not for a request another instance passed on) */
  journal?: { store: JournalStore; log: (line: string) => void } | null;
}

/** one prefix cache per session manager (one per server): KV reuse across requests */
const prefixCaches = new WeakMap<SessionManager, PrefixCache>();
function prefixCacheOf(sessions: SessionManager): PrefixCache {
  let c = prefixCaches.get(sessions);
  if (!c) prefixCaches.set(sessions, (c = new PrefixCache({ evict: (_route, sid) => void sessions.close(sid, 'closed').catch(() => undefined) })));
  return c;
}

const tokenizers = new WeakMap<Room, Tokenizer>();
function tokenizerOf(room: Room): Tokenizer {
  let t = tokenizers.get(room);
  if (!t) tokenizers.set(room, (t = Tokenizer.fromMetadata(room.model.header.metadata)));
  return t;
}

/**
 * OpenAI's error shape: `param` names the field (openai-request.ts's `param`, or a schema's
 * `field`), `code` is OpenAI's where it has one (context_length_exceeded).
 */
function openAiError(res: ServerResponse, e: unknown): void {
  const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
  const status = httpStatusFor(err.code);
  const type = err.code === 'AUTH_FAILED' ? 'authentication_error' : status === 429 ? 'rate_limit_error' : status >= 500 ? 'server_error' : 'invalid_request_error';
  const { field, param, ...details } = err.details ?? {};
  const named = typeof param === 'string' ? param : typeof field === 'string' && field !== '(whole)' ? field : null;
  if (typeof details.retryAfterS === 'number') res.setHeader('retry-after', String(details.retryAfterS));
  sendJson(res, status, {
    error: { message: err.message, type, param: named, code: err.code === 'CONTEXT_LENGTH_EXCEEDED' ? 'context_length_exceeded' : err.code, ...details },
  });
}

function pickRoom(name: string | undefined, allowed: Room[]): Room {
  const room = name ? allowed.find((r) => r.model.id === name || r.id === name) : allowed.length === 1 ? allowed[0] : undefined;
  if (!room) throw new MeshError('NOT_FOUND', `no model '${name ?? ''}' in the rooms this key opens (models: ${allowed.map((r) => r.model.id).join(', ')})`, { param: 'model' });
  return room;
}

export function modelsList(allowed: Room[]): unknown {
  return {
    object: 'list',
    data: allowed.map((r) => ({ id: r.model.id, object: 'model', created: 0, owned_by: 'gguf-mesh', room: r.id, route_status: r.route?.status ?? 'forming' })),
  };
}

/** One choice's outcome: the route's result and the log-probabilities of the tokens its text holds. */
interface ChoiceResult {
  result: RouteGenerationResult;
  logprobs: SampledLogprob[];
  /** tool calls read from the reply, and the text left around them */
  calls: ToolCall[];
  content: string;
  /** OpenAI's finish_reason */
  finish: string;
}

/** What a request shares across its choices while it runs. */
interface RequestRun {
  req: ParsedRequest;
  room: Room;
  tokenizer: Tokenizer;
  promptTokens: number[];
  /** the completions prompt's text (echo) */
  promptText: string;
  maxTokens: number;
  /** the model's context length */
  nCtx: number;
  id: string;
  created: number;
  model: string;
  abort: AbortController;
  /** an SSE writer while streaming, else null */
  sse: ((data: unknown, event?: string) => void) | null;
  repairs: TelemetryEvent[];
  /** the tools the model may call (chat with tools, tool_choice not "none"), and the template's call format */
  tools: { tools: ToolSpec[]; choice: ToolChoice; format: ToolFormat } | null;
}

function promptOf(req: ParsedRequest, template: ChatTemplate | null, tokenizer: Tokenizer, tools: RequestRun['tools']): { tokens: number[]; text: string } {
  if (template) {
    const messages = req.messages.map((m) => templateMessage({ ...m, content: messageText(m.content) }) as unknown as ChatMessage);
    const text = template.prompt(tokenizer, messages, tools ? { variables: { tools: templateTools(tools.tools) } } : {});
    return { tokens: tokenizer.encode(text), text };
  }
  if (typeof req.prompt !== 'string') return { tokens: req.prompt, text: tokenizer.decode(req.prompt) };
  return { tokens: tokenizer.encode(req.prompt), text: req.prompt };
}

function chunkOf(run: RequestRun, index: number, delta: Record<string, unknown> | string, finishReason: string | null, extra: Record<string, unknown> = {}, logprobs: SampledLogprob[] = [], offset = 0): unknown {
  const { id, created, model, tokenizer } = run;
  const lp = logprobs.length === 0 ? null : run.req.chat ? chatLogprobs(tokenizer, logprobs) : completionLogprobs(tokenizer, logprobs, offset);
  return run.req.chat
    ? { id, object: 'chat.completion.chunk', created, model, choices: [{ index, delta: typeof delta === 'string' ? { content: delta } : delta, logprobs: lp, finish_reason: finishReason }], ...extra }
    : { id, object: 'text_completion', created, model, choices: [{ index, text: typeof delta === 'string' ? delta : '', logprobs: lp, finish_reason: finishReason }], ...extra };
}

/** OpenAI's rule: the prompt and the completion must fit the context, or the request is a 400. */
function checkContext(promptTokens: number, maxTokens: number, nCtx: number, chat: boolean): void {
  if (promptTokens + Math.max(1, maxTokens) <= nCtx) return;
  const what = chat ? 'messages' : 'prompt';
  throw new MeshError(
    'CONTEXT_LENGTH_EXCEEDED',
    `This model's maximum context length is ${nCtx} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the ${what}, ${maxTokens} for the completion). Please reduce the length of the ${what} or completion.`,
    { param: what, promptTokens, maxTokens, contextLength: nCtx },
  );
}

const finishOf = (r: RouteGenerationResult): string => (r.stopReason === 'max_tokens' || r.stopReason === 'context_full' ? 'length' : 'stop');

/**
 * Waits for the room's route to be ready, reporting its status and loading progress. A streamed
 * request waits whatever the route's state (its client sees the progress); any other waits only
 * while a route is on its way — loading (a re-plan's new route too) or repairing — and is told
 * at once when none is (no peers, a plan that cannot be made).
 */
async function readyRoute(run: RequestRun, progress: (e: TelemetryEvent) => void): Promise<NonNullable<Room['route']>> {
  const { room } = run;
  const deadline = Date.now() + ROUTE_WAIT_MS;
  const coming = (status: string | undefined): boolean => run.sse !== null || status === 'loading' || status === 'repairing';
  const stopLoading = room.route?.status !== 'ready' ? room.subscribe((e) => e.type === 'stage_loading' && progress(e)) : null;
  try {
    for (let last = ''; room.route?.status !== 'ready'; ) {
      const r = room.route;
      const state = r ? `${r.status}:${r.reason ?? ''}:${r.stages.map((s) => s.status).join(',')}` : 'none';
      if (state !== last) {
        last = state;
        progress({ type: 'route_status', routeId: r?.id ?? 0, status: r?.status ?? 'forming', reason: r?.reason ?? 'no peers yet' });
      }
      if (Date.now() >= deadline || !coming(r?.status) || run.abort.signal.aborted) throw new MeshError('ROUTE_NOT_READY', `model ${run.model}: route is ${r?.status ?? 'not planned'}${r?.reason ? ` (${r.reason})` : ''}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  } finally {
    stopLoading?.();
  }
  return room.route!;
}

/**
 * Runs choice `index` as its own session. Log-probabilities travel with the text: those of the
 * tokens behind each delta go out with it, and tokens whose text never shows (EOG, a stop
 * string) report none — streamed and not alike.
 */
async function runChoice(run: RequestRun, index: number, ctx: OpenAiContext, req: IncomingMessage, progress: (e: TelemetryEvent) => void): Promise<ChoiceResult> {
  const route = run.room.route!;
  const link = new LocalLink((f) => ctx.sessions.handle(f, req, ctx.principal ?? null));
  let unsubscribe: (() => void) | null = null;
  let sessionId: string | null = null;
  let firstToken = false;
  let lastStep: TelemetryEvent | null = null;
  const pending: SampledLogprob[] = [];
  const kept: SampledLogprob[] = [];
  let offset = run.req.echo ? run.promptText.length : 0;
  if (run.sse && run.req.echo) run.sse(chunkOf(run, index, run.promptText, null));
  const wantLogprobs = run.req.logprobs !== null;
  // constrained JSON: raw control characters inside strings escaped, so the output parses (structured-output.ts)
  const escape = run.req.format ? controlEscaper() : null;
  let text = '';
  // with tools, calls are read from the reply as it comes: text goes out as content, calls as tool_calls deltas
  const reader = run.tools ? toolReader(run.tools.format, run.tools.tools, run.tools.choice !== 'auto') : null;
  let unsent: SampledLogprob[] = [];
  const sendTools = (events: ToolEvent[]): void => {
    for (const e of events) {
      const extra = lastStep ? { gguf_mesh: lastStep } : {};
      run.sse!(chunkOf(run, index, e.kind === 'content' ? e.text : toolDelta(e), null, extra, unsent));
      unsent = [];
    }
  };
  const onDelta = (raw: string): void => {
    const d = escape ? escape(raw) : raw;
    text += d;
    if (!d) return;
    const lps = pending.splice(0);
    kept.push(...lps);
    if (reader) {
      // the tokens behind held-back text go out with the next chunk
      unsent.push(...lps);
      const events = reader.push(d);
      if (run.sse) sendTools(events);
    } else run.sse?.(chunkOf(run, index, d, null, lastStep ? { gguf_mesh: lastStep } : {}, lps, offset));
    offset += d.length;
  };
  // KV reuse: one choice continues a kept session whose tokens the prompt extends, and is kept afterwards
  const cache = run.req.n === 1 && run.req.cachePrompt && !run.req.format ? prefixCacheOf(ctx.sessions) : null;
  // response_format: sampled here under the grammar, from the last stage's logits
  const constraint = run.req.format ? await outputConstraint(run.tokenizer, run.req.format) : null;
  const need = run.promptTokens.length + run.maxTokens;
  const reuse = cache?.take(route.id, run.promptTokens, need) ?? null;
  const generate = (withReuse: boolean): Promise<RouteGenerationResult> => generateOnRoute(link, route.id, run.tokenizer, {
    ...(cache ? { keep: true, contextLength: Math.min(run.nCtx, need + KEEP_HEADROOM) } : {}),
    ...(withReuse && reuse ? { reuse } : {}),
    ...(constraint ? { constraint } : {}),
    promptTokens: run.promptTokens,
    maxTokens: run.maxTokens,
    sampler: choiceSampler(run.req.sampler, index),
    ...(wantLogprobs ? { logprobs: run.req.logprobs! } : {}),
    ...(run.req.speculate !== undefined ? { speculate: run.req.speculate } : {}),
    stopStrings: run.req.stop,
    signal: run.abort.signal,
    onSession: (sid) => {
      sessionId = sid;
      (unsubscribe as (() => void) | null)?.(); // a stale kept session's, when a fresh one replaced it
      // progress from the session manager (prefill per chunk) reaches the stream too
      // a continued (kept) session's earlier events belong to the requests before this one
      unsubscribe = ctx.sessions.subscribe(sid, (e) => {
        if (!firstToken && e.type === 'prefill_progress') progress(e);
        // a stage lost and the route repaired under the session: the client sees it happen, but no error
        if (e.type === 'stage_lost' || e.type === 'route_repairing' || e.type === 'route_repaired') {
          run.repairs.push(e);
          progress(e);
        }
      }, reuse !== null && sid === reuse.sessionId);
    },
    onEvent: (e) => {
      if (e.type === 'token') {
        firstToken = true;
        if (e.logprob) pending.push(e.logprob);
      }
      if (e.type === 'step_timing') lastStep = e;
      if (sessionId && (e.type === 'token' || e.type === 'step_timing' || e.type === 'session_summary')) ctx.sessions.publish(sessionId, e);
    },
    // each content chunk carries the per-stage breakdown of the step that produced it
    onDelta,
  });
  let result: RouteGenerationResult;
  try {
    result = await generate(true).catch((e: unknown) => {
      // the kept session went away before it produced anything: a fresh session instead
      if (!reuse || firstToken || !(e instanceof MeshError) || !STALE_SESSION.has(e.code)) throw e;
      return generate(false);
    });
  } finally {
    (unsubscribe as (() => void) | null)?.();
  }
  if (result.kept) {
    ctx.sessions.keep(result.kept.sessionId);
    cache!.put(route.id, result.kept);
  }
  if (escape) result.text = text;
  let finish = finishOf(result);
  if (reader) {
    const events = reader.end();
    if (run.sse) {
      // a call already streamed cannot turn back into text: broken, the stream ends in an error; cut by max_tokens, finish_reason says so
      if (reader.broken || (reader.cut && finish !== 'length')) throw new MeshError('TOOL_CALL_BROKEN', reader.broken ?? 'the reply ended inside a tool call already streamed');
      sendTools(events);
      if (reader.calls.length > 0 && !reader.cut) finish = 'tool_calls';
    }
  }
  const { content, calls } = reader ? reader.result() : { content: result.text, calls: [] };
  if (!run.sse && calls.length > 0) finish = 'tool_calls';
  run.sse?.(chunkOf(run, index, run.req.chat ? {} : '', finish, { gguf_mesh: result.summary }, unsent));
  return { result, logprobs: kept, calls, content: content ?? '', finish };
}

function usageOf(promptTokens: number, choices: readonly ChoiceResult[]): Record<string, unknown> {
  const completion = choices.reduce((a, c) => a + c.result.tokens.length, 0);
  const cached = choices.reduce((a, c) => a + c.result.cachedTokens, 0);
  return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion, prompt_tokens_details: { cached_tokens: cached } };
}

function responseOf(run: RequestRun, choices: readonly ChoiceResult[]): unknown {
  const { id, created, model, tokenizer } = run;
  const chat = run.req.chat;
  const wantLp = run.req.logprobs !== null;
  return {
    id,
    object: chat ? 'chat.completion' : 'text_completion',
    created,
    model,
    choices: choices.map(({ result, logprobs, calls, content, finish }, index) =>
      chat
        ? {
            index,
            message: { role: 'assistant', content: calls.length > 0 && !content ? null : content, refusal: null, ...(calls.length > 0 ? { tool_calls: calls } : {}) },
            logprobs: wantLp ? chatLogprobs(tokenizer, logprobs) : null,
            finish_reason: finish,
          }
        : {
            index,
            text: (run.req.echo ? run.promptText : '') + result.text,
            logprobs: wantLp ? completionLogprobs(tokenizer, logprobs, run.req.echo ? run.promptText.length : 0) : null,
            finish_reason: finishOf(result),
          },
    ),
    usage: usageOf(run.promptTokens.length, choices),
    gguf_mesh: {
      session_id: choices[0]!.result.sessionId,
      ...(choices.length > 1 ? { session_ids: choices.map((c) => c.result.sessionId) } : {}),
      summary: choices[0]!.result.summary,
      ...(run.repairs.length ? { repairs: run.repairs } : {}),
    },
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
  let leave: (() => void) | null = null;
  let clientGone = false;
  res.once('close', () => (clientGone = !res.writableFinished));
  /** a stream's events on their way out (numbered, and journaled for a reconnect where there is a store) */
  let journal: StreamJournal | null = null;
  try {
    let raw = await readJsonBody(req, MAX_BODY_BYTES, 'an OpenAI request object');
    // a stream journaled for a reconnect runs seeded, so that it can be generated again (stream-resume.ts)
    const journaled = ctx.journal && (raw as { stream?: unknown } | null)?.stream === true ? reproducible(raw) : null;
    if (journaled) raw = journaled.body;
    const name = typeof raw === 'object' && raw !== null && typeof (raw as { model?: unknown }).model === 'string' ? (raw as { model: string }).model : undefined;
    const room = pickRoom(name, allowed);
    const tokenizer = tokenizerOf(room);
    const nCtx = hyperParameters(room.model.header).n_ctx_train || 2048; // as configFromHeader defaults it
    const parsed = parseRequest(raw, chat, tokenizer.size, nCtx);
    const template = chat ? ChatTemplate.fromMetadata(room.model.header.metadata, { tokenizer, fallback: true }) : null;
    const wanted = chat ? toolsOf(parsed.tools, parsed.toolChoice) : null;
    const tools = wanted && template ? { ...wanted, format: toolFormatOf(template) } : null;
    const forced = tools ? forcedCallFormat(tools.tools, tools.choice, tools.format) : null;
    if (forced && parsed.format) throw badParam('response_format', 'a forced tool call (tool_choice) already fixes the output format');
    if (forced) parsed.format = forced;
    const prompt = promptOf(parsed, template, tokenizer, tools);
    const maxTokens = parsed.maxTokens ?? (chat ? Math.max(0, Math.min(512, nCtx - prompt.tokens.length)) : Math.min(16, Math.max(0, nCtx - prompt.tokens.length)));
    checkContext(prompt.tokens.length, maxTokens, nCtx, chat);
    // a turn among the running generations, or a place in the bounded queue, or 429 now
    const queued = new AbortController();
    res.once('close', () => queued.abort());
    leave = await ctx.gate.enter(queued.signal);
    const abort = new AbortController();
    // a client that goes away cancels its sessions on every stage at once, mid-prefill too:
    // each stage drops its queued chunks and stops after the one computing
    res.on('close', () => {
      if (res.writableFinished) return;
      abort.abort();
      void ctx.sessions.ownerGone(req);
    });
    const write = (s: string): void => void (res.writableEnded || res.write(s));
    journal = journaled
      ? new StreamJournal(ctx.journal!.store, { roomId: room.id, digest: bodyDigest(journaled.body), seed: journaled.body.seed as number }, write, (e) => ctx.journal!.log(`journaling a stream failed: ${e.message}`))
      : new StreamJournal(null, null, write);
    // every event carries `id: <completion id>:<text offset>`, what a reconnect names in Last-Event-ID
    const events = journal;
    const sse = (data: unknown, event?: string): void => events.event(`${event ? `event: ${event}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}`, typeof data === 'string' ? '' : pieceOf(data));
    const run: RequestRun = {
      req: parsed, room, tokenizer, promptTokens: prompt.tokens, promptText: prompt.text,
      maxTokens,
      nCtx,
      id: `${chat ? 'chatcmpl' : 'cmpl'}-${randomBytes(12).toString('hex')}`, created: Math.floor(Date.now() / 1000), model: room.model.id,
      abort, sse: parsed.stream ? sse : null, repairs: [], tools,
    };
    if (parsed.stream) {
      streaming = true;
      events.setId(run.id);
      res.writeHead(200, SSE_HEAD);
      if (chat) for (let i = 0; i < parsed.n; i++) sse(chunkOf(run, i, { role: 'assistant', content: '' }, null));
    }
    const progress = (e: TelemetryEvent): void => {
      if (streaming) sse(chunkOf(run, 0, chat ? {} : '', null, { gguf_mesh: e }));
    };
    const route = await readyRoute(run, progress);
    progress({ type: 'route_planned', routeId: route.id, stages: route.stages.map((s) => ({ stage: s.stage, peerId: s.peerId, start: s.shard.start, end: s.shard.end })) });
    // n choices: n sessions at once; the first failure fails the request (the others are cancelled)
    const choices = await Promise.all(Array.from({ length: parsed.n }, (_, i) => runChoice(run, i, ctx, req, progress))).catch((e: unknown) => {
      abort.abort();
      throw e;
    });
    if (streaming) {
      if (parsed.includeUsage) sse({ id: run.id, object: chat ? 'chat.completion.chunk' : 'text_completion', created: run.created, model: run.model, choices: [], usage: usageOf(run.promptTokens.length, choices) });
      sse('[DONE]');
      // a cancelled generation ends here too: a client that went away keeps its stream's record
      await events.close(!clientGone);
      res.end();
    } else {
      sendJson(res, 200, responseOf(run, choices));
    }
  } catch (e) {
    const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
    if (streaming) {
      if (!res.writableEnded) {
        journal!.event(`event: error\ndata: ${JSON.stringify({ error: { message: err.message, type: 'server_error', code: err.code, ...err.details } })}`);
        // a client that went away may reconnect: its stream's record stays
        await journal!.close(!clientGone);
        res.end();
      }
    } else if (!res.headersSent) openAiError(res, err);
    else res.destroy();
  } finally {
    (leave as (() => void) | null)?.();
  }
  return true;
}
