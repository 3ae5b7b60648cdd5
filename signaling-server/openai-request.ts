// Reads an OpenAI request body into what the route runs: every field is honoured, refused with
// a 400 that names it (`param`), or — only where OpenAI itself lets a field pass without effect
// here (user, metadata, service_tier, …) — accepted and ignored. Unknown fields are refused as
// OpenAI refuses them ("unrecognized request argument"). docs/openai.md lists the table.

import { MeshError } from '../src/errors.ts';
import type { SamplerSettings } from '../src/protocol/session.ts';
import { MAX_DRAFT_TOKENS } from '../src/protocol/session.ts';
import { MAX_TOP_LOGPROBS } from '../src/protocol/frame.ts';

export type ChatContent = string | Array<{ type: string; text?: string }> | null;
export interface ChatMessageIn {
  role: string;
  content?: ChatContent;
  name?: string;
  /** an assistant's earlier calls */
  tool_calls?: unknown[];
  /** a tool result's call */
  tool_call_id?: string;
}

/** What response_format asks for: any JSON object, or JSON matching a schema. */
export type OutputFormat = { kind: 'json' } | { kind: 'schema'; schema: unknown };

/** A request as the route runs it. */
export interface ParsedRequest {
  chat: boolean;
  model: string | undefined;
  messages: ChatMessageIn[];
  /** completions: the prompt as text, or as token ids */
  prompt: string | number[];
  /** undefined: the endpoint's default (chat: up to 512 and the context; completions: 16) */
  maxTokens: number | undefined;
  /** the settings of choice 0; choice i draws with seed + i */
  sampler: SamplerSettings;
  /** no seed asked: each choice gets a random one */
  seeded: boolean;
  stop: string[];
  stream: boolean;
  includeUsage: boolean;
  n: number;
  /** top alternatives per token when log-probabilities are asked for; null: none */
  logprobs: number | null;
  /** completions: the prompt's text comes first in the choice's text */
  echo: boolean;
  /** continue a kept session whose tokens the prompt extends, and keep this one (llama-server's cache_prompt; default true) */
  cachePrompt: boolean;
  /** response_format json_object / json_schema: the output is constrained to it (null: text) */
  format: OutputFormat | null;
  /** tools and tool_choice as sent (openai-tools.ts reads them against the template) */
  tools: unknown;
  toolChoice: unknown;
  /** our extension: drafts per route pass for a greedy request (speculative decoding; 0 = off); undefined: the server's `--speculate` */
  speculate: number | undefined;
}

/** Fields a client may send that change nothing here, as on OpenAI where they only label or store a request. */
const IGNORED = new Set(['user', 'metadata', 'service_tier', 'parallel_tool_calls', 'stream_options']);
const COMMON = new Set(['model', 'stream', 'max_tokens', 'temperature', 'top_p', 'n', 'stop', 'presence_penalty', 'frequency_penalty', 'logit_bias', 'seed', 'logprobs',
  // llama-server / vLLM extensions clients send to OpenAI-compatible servers
  'top_k', 'min_p', 'repetition_penalty', 'repeat_penalty', 'repeat_last_n', 'cache_prompt',
  // ours: speculative decoding's drafts per route pass
  'speculate']);
const CHAT = new Set(['messages', 'max_completion_tokens', 'top_logprobs', 'response_format', 'tools', 'tool_choice', 'functions', 'function_call', 'store', 'modalities', 'audio', 'prediction', 'reasoning_effort', 'web_search_options']);
const COMPLETIONS = new Set(['prompt', 'suffix', 'echo', 'best_of']);

/** A 400 naming the parameter, as OpenAI's errors do (`param`). */
export function badParam(param: string, message: string): MeshError {
  return new MeshError('BAD_REQUEST', `${param}: ${message}`, { param });
}

const present = (v: unknown): boolean => v !== undefined && v !== null;

function num(body: Record<string, unknown>, name: string, lo: number, hi: number, opts: { integer?: boolean; loOpen?: boolean } = {}): number | undefined {
  const v = body[name];
  if (!present(v)) return undefined;
  const ok = typeof v === 'number' && Number.isFinite(v) && (opts.loOpen ? v > lo : v >= lo) && v <= hi && (!opts.integer || Number.isInteger(v));
  if (!ok) throw badParam(name, `must be ${opts.integer ? 'an integer' : 'a number'} in ${opts.loOpen ? '(' : '['}${lo}, ${hi}], got ${JSON.stringify(v)}`);
  return v as number;
}

function refuseUnless(body: Record<string, unknown>, name: string, allowed: (v: unknown) => boolean, why: string): void {
  if (present(body[name]) && !allowed(body[name])) throw badParam(name, why);
}

/** The request's sampler settings (choice 0's seed), checked against the vocabulary and context. */
function samplerOf(body: Record<string, unknown>, nVocab: number, nCtx: number): { sampler: SamplerSettings; seeded: boolean } {
  const s: SamplerSettings = {};
  s.temperature = num(body, 'temperature', 0, 2) ?? 1;
  const topP = num(body, 'top_p', 0, 1, { loOpen: true });
  if (topP !== undefined) s.topP = topP;
  const topK = num(body, 'top_k', -1, nVocab, { integer: true });
  if (topK !== undefined && topK > 0) s.topK = topK;
  const minP = num(body, 'min_p', 0, 1);
  if (minP !== undefined) s.minP = minP;
  const presence = num(body, 'presence_penalty', -2, 2);
  if (presence !== undefined) s.presencePenalty = presence;
  const frequency = num(body, 'frequency_penalty', -2, 2);
  if (frequency !== undefined) s.frequencyPenalty = frequency;
  if (present(body.repetition_penalty) && present(body.repeat_penalty)) throw badParam('repeat_penalty', 'give repetition_penalty or repeat_penalty, not both');
  const repeat = num(body, 'repetition_penalty', 0, 10, { loOpen: true }) ?? num(body, 'repeat_penalty', 0, 10, { loOpen: true });
  if (repeat !== undefined) s.repeatPenalty = repeat;
  const lastN = num(body, 'repeat_last_n', -1, nCtx, { integer: true });
  if (lastN !== undefined) s.repeatLastN = lastN === -1 ? nCtx : lastN; // llama-server: -1 = the context size
  if (present(body.logit_bias)) {
    const lb = body.logit_bias;
    if (typeof lb !== 'object' || Array.isArray(lb)) throw badParam('logit_bias', 'must be an object of token id → bias');
    const out: Record<string, number> = {};
    for (const [k, v] of Object.entries(lb as Record<string, unknown>)) {
      const id = Number(k);
      if (!/^\d+$/.test(k) || id >= nVocab) throw badParam('logit_bias', `'${k}' is not a token id of this model (0 … ${nVocab - 1})`);
      if (typeof v !== 'number' || !(v >= -100 && v <= 100)) throw badParam('logit_bias', `the bias of token ${k} must be a number in [-100, 100], got ${JSON.stringify(v)}`);
      out[String(id)] = v;
    }
    if (Object.keys(out).length > 0) s.logitBias = out;
  }
  const seed = num(body, 'seed', -(2 ** 63), 2 ** 64, { integer: true });
  s.seed = seed === undefined ? (Math.random() * 2 ** 32) >>> 0 : seed >>> 0;
  return { sampler: s, seeded: seed !== undefined };
}

/** What the request asks for log-probabilities: null, or how many top alternatives. */
function logprobsOf(body: Record<string, unknown>, chat: boolean): number | null {
  if (!chat) {
    // completions: logprobs is the number of top alternatives (OpenAI allows up to 5)
    const k = num(body, 'logprobs', 0, 5, { integer: true });
    return k === undefined ? null : k;
  }
  if (present(body.logprobs) && typeof body.logprobs !== 'boolean') throw badParam('logprobs', `must be true or false, got ${JSON.stringify(body.logprobs)}`);
  const top = num(body, 'top_logprobs', 0, MAX_TOP_LOGPROBS, { integer: true });
  if (top !== undefined && body.logprobs !== true) throw badParam('top_logprobs', 'needs logprobs: true');
  return body.logprobs === true ? (top ?? 0) : null;
}

/** Checks every field of an OpenAI request body and returns what the route runs. */
export function parseRequest(raw: unknown, chat: boolean, nVocab: number, nCtx: number): ParsedRequest {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new MeshError('BAD_REQUEST', 'the request body must be a JSON object', { field: '(whole)' });
  const body = raw as Record<string, unknown>;
  for (const k of Object.keys(body)) {
    if (!IGNORED.has(k) && !COMMON.has(k) && !(chat ? CHAT : COMPLETIONS).has(k)) throw badParam(k, `unrecognized request argument${!chat && CHAT.has(k) ? ' (a chat completions argument)' : chat && COMPLETIONS.has(k) ? ' (a completions argument)' : ''}`);
  }
  const model = body.model;
  if (present(model) && typeof model !== 'string') throw badParam('model', 'must be a string');
  refuseUnless(body, 'stream', (v) => typeof v === 'boolean', 'must be true or false');
  const so = body.stream_options;
  if (present(so) && (typeof so !== 'object' || Array.isArray(so))) throw badParam('stream_options', 'must be an object');

  // refused: what this server cannot do, named
  refuseUnless(body, 'functions', (v) => Array.isArray(v) && v.length === 0, 'function calling is not supported');
  refuseUnless(body, 'function_call', (v) => v === 'none' || v === 'auto', 'function calling is not supported');
  refuseUnless(body, 'store', (v) => v === false, 'completions are not stored here');
  refuseUnless(body, 'modalities', (v) => Array.isArray(v) && v.every((m) => m === 'text'), "only the 'text' modality is served");
  for (const k of ['audio', 'prediction', 'web_search_options', 'reasoning_effort']) refuseUnless(body, k, () => false, 'not supported by this server');
  refuseUnless(body, 'suffix', (v) => v === '', 'fill-in-the-middle (suffix) is not supported');

  const n = num(body, 'n', 1, 16, { integer: true }) ?? 1;
  const bestOf = num(body, 'best_of', 1, 16, { integer: true });
  if (bestOf !== undefined && bestOf !== n) throw badParam('best_of', `only best_of = n (${n}) is supported: choices are not ranked server-side`);
  const logprobs = logprobsOf(body, chat);
  refuseUnless(body, 'echo', (v) => typeof v === 'boolean', 'must be true or false');
  const echo = body.echo === true;
  refuseUnless(body, 'cache_prompt', (v) => typeof v === 'boolean', 'must be true or false');
  if (echo && logprobs !== null) throw badParam('echo', "echo with logprobs is not supported (the prompt's log-probabilities are not computed)");

  const maxTokens = num(body, 'max_completion_tokens', 0, nCtx, { integer: true }) ?? num(body, 'max_tokens', 0, nCtx, { integer: true });
  const stopRaw = body.stop;
  if (present(stopRaw) && typeof stopRaw !== 'string' && !(Array.isArray(stopRaw) && stopRaw.length <= 4 && stopRaw.every((x) => typeof x === 'string'))) throw badParam('stop', 'must be a string or an array of up to 4 strings');
  const stop = !present(stopRaw) ? [] : Array.isArray(stopRaw) ? (stopRaw as string[]).filter((x) => x !== '') : stopRaw === '' ? [] : [stopRaw as string];

  let messages: ChatMessageIn[] = [];
  let prompt: string | number[] = '';
  if (chat) {
    if (!Array.isArray(body.messages) || body.messages.length === 0) throw badParam('messages', 'must be a non-empty array');
    messages = body.messages.map((m: unknown, i: number) => {
      if (typeof m !== 'object' || m === null || Array.isArray(m)) throw badParam(`messages.${i}`, 'must be a message object');
      if (typeof (m as ChatMessageIn).role !== 'string') throw badParam(`messages.${i}.role`, `message ${i} needs a role`);
      const msg = m as ChatMessageIn;
      if (msg.tool_calls !== undefined && (msg.role !== 'assistant' || !Array.isArray(msg.tool_calls))) throw badParam(`messages.${i}.tool_calls`, `message ${i}: tool_calls belong to an assistant message, as an array`);
      if (msg.role === 'tool' && typeof msg.tool_call_id !== 'string') throw badParam(`messages.${i}.tool_call_id`, `message ${i}: a tool message needs the tool_call_id it answers`);
      const c = msg.content;
      if (present(c) && typeof c !== 'string' && !(Array.isArray(c) && c.every((p) => typeof p === 'object' && p !== null))) throw badParam(`messages.${i}.content`, `message ${i}: content must be a string or an array of parts`);
      if (Array.isArray(c) && c.some((p) => p.type !== 'text')) throw badParam(`messages.${i}.content`, `message ${i}: only text parts are supported`);
      return msg;
    });
  } else {
    const p = body.prompt;
    if (typeof p === 'string') prompt = p;
    else if (Array.isArray(p) && p.length === 1 && typeof p[0] === 'string') prompt = p[0];
    else if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isInteger(x) && x >= 0 && x < nVocab)) prompt = p as number[];
    else throw badParam('prompt', 'must be a string, an array of one string, or an array of token ids (batches of prompts are not supported)');
  }
  return {
    chat, model: model as string | undefined, messages, prompt, maxTokens, ...samplerOf(body, nVocab, nCtx), stop,
    stream: body.stream === true, includeUsage: (so as { include_usage?: unknown } | undefined)?.include_usage === true, n, logprobs, echo, cachePrompt: body.cache_prompt !== false, format: outputFormatOf(body.response_format), tools: body.tools, toolChoice: body.tool_choice,
    speculate: num(body, 'speculate', 0, MAX_DRAFT_TOKENS, { integer: true }),
  };
}

/** Reads response_format: null for text (or absent). */
export function outputFormatOf(v: unknown): OutputFormat | null {
  if (v === undefined || v === null) return null;
  const f = v as { type?: unknown; json_schema?: { schema?: unknown } };
  if (typeof v !== 'object' || Array.isArray(v)) throw badParam('response_format', 'must be an object');
  if (f.type === 'text') return null;
  if (f.type === 'json_object') return { kind: 'json' };
  if (f.type === 'json_schema') {
    const schema = f.json_schema?.schema;
    if (typeof schema !== 'object' || schema === null) throw badParam('response_format', 'json_schema needs json_schema.schema, a JSON schema object');
    return { kind: 'schema', schema };
  }
  throw badParam('response_format', `type must be 'text', 'json_object' or 'json_schema', got ${JSON.stringify(f.type)}`);
}

/** Choice i's settings: seed + i, so the choices differ and a seed still reproduces all of them. */
export function choiceSampler(s: SamplerSettings, i: number): SamplerSettings {
  return { ...s, seed: ((s.seed ?? 0) + i) >>> 0 };
}

export function messageText(content: ChatContent | undefined): string {
  if (content === null || content === undefined) return '';
  return typeof content === 'string' ? content : content.filter((p) => p.type === 'text').map((p) => p.text ?? '').join('');
}
