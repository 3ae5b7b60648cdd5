// The session-open schema every side reads: the client (CLI, OpenAI API, page) writes it into
// a SessionOpen frame's JSON body, the server's session manager and every stage read it back.
// Session ids are 128 random bits, hex, as the frame header carries them.

import * as v from 'valibot';
import type { SamplerOptions } from '../model/sampler.ts';
import { MAX_TOP_LOGPROBS } from './frame.ts';
import { count, list, validate } from './validate.ts';

/** The largest context a session may declare; the route's model caps it further. */
export const MAX_CONTEXT_LENGTH = 1 << 24;

// typed as the sampler's options: a field added there and not here fails tsc
const samplerSchema: v.GenericSchema<unknown, SamplerOptions> = v.object({
  // numbers only here: their ranges are the sampler's to refuse (BAD_SAMPLER_OPTION, on every implementation)
  temperature: v.optional(v.number()),
  topK: v.optional(v.number()),
  topP: v.optional(v.number()),
  minP: v.optional(v.number()),
  repeatPenalty: v.optional(v.number()),
  frequencyPenalty: v.optional(v.number()),
  presencePenalty: v.optional(v.number()),
  repeatLastN: v.optional(v.number()),
  /** token id → bias (JSON has no -Infinity; the API's [-100, 100] is applied before) */
  logitBias: v.optional(v.pipe(v.record(v.string(), v.number()), v.check((o) => Object.keys(o).length <= 1 << 16, 'at most 65536 biased tokens'))),
  seed: v.optional(v.number()),
});
/** Sampling on the last stage (llama.cpp's chain: model/sampler.ts's options, JSON as they travel); absent or temperature 0 is greedy. */
export type SamplerSettings = SamplerOptions;

/** Most drafts one Verify frame carries (speculative decoding). */
export const MAX_DRAFT_TOKENS = 16;

/** whether the settings turn on a penalty (which reads the token history at the last stage) */
export function usesPenalties(s: SamplerSettings): boolean {
  return (s.repeatLastN ?? 64) > 0 && ((s.repeatPenalty ?? 1) !== 1 || (s.frequencyPenalty ?? 0) !== 0 || (s.presencePenalty ?? 0) !== 0);
}

/** the session's token ids, as far as the client knows them (penalty history) */
const tokenIds = list(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0x7fffffff)), MAX_CONTEXT_LENGTH);
const logprobCount = v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(MAX_TOP_LOGPROBS));

export const sessionOpenSchema = v.object({
  contextLength: v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(MAX_CONTEXT_LENGTH)),
  sampler: v.optional(samplerSchema),
  /** how hidden states travel between stages (default f16) */
  hiddenDtype: v.optional(v.picklist(['f16', 'f32'])),
  /** prompt tokens the client will prefill, for progress reports */
  promptLength: v.optional(count),
  /** random draws the session's sampler has made already: a replacement last stage skips them, so seeded sampling continues as it would have */
  draws: v.nullish(count),
  /**
   * the session's token ids from position 0 on, as far as the client knows them (the prompt;
   * on a replacement stage, every token fed so far): the last stage's penalties read them.
   * Sent only when a penalty is on.
   */
  tokens: v.optional(tokenIds),
  /** the last stage answers each sampled token with its log-probability and this many top alternatives (0–20); absent: no log-probabilities */
  logprobs: v.optional(logprobCount),
  /** how the sampled token reaches the session manager: 'direct' (default, where every stage takes it: the last stage sends it one-way), 'climb' (back up through every stage) or 'ring' (one-way, and straight to stage 0 too, where the next step waits: route/ring-ahead.ts; 'direct' on a route without the ring) */
  tokenPath: v.optional(v.picklist(['direct', 'climb', 'ring'])),
  /** speculative decoding (route/speculation.ts): drafts verified per route pass, 0 = off; absent: the server's default (`serve --speculate N`). Greedy sessions only */
  speculate: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(MAX_DRAFT_TOKENS))),
});
/** Body of a SessionOpen frame. */
export type SessionOpenBody = v.InferOutput<typeof sessionOpenSchema>;

/** A SessionOpen frame's JSON body, checked: BAD_REQUEST naming the field. */
export function parseSessionOpen(body: unknown): SessionOpenBody {
  return validate(sessionOpenSchema, body, 'session open', 'BAD_REQUEST');
}

// (null draws or from read as absent, as every implementation reads them)
const rewindSchema = v.object({
  draws: v.nullish(count, 0),
  /** the token ids from position `from` (default: the rewind position) on, as far as the client knows them (penalty history; see SessionOpenBody.tokens) */
  tokens: v.optional(tokenIds),
  from: v.nullish(count),
  /** new sampler settings from now on (a new turn's) */
  sampler: v.optional(samplerSchema),
  /** new log-probability setting from now on (null: none) */
  logprobs: v.optional(v.nullable(logprobCount)),
  /** the session's ring generation from now on (route/ring-ahead.ts): stage 0 drops ring tokens of an older one */
  ring: v.optional(count),
});
/**
 * Body of a Rewind frame: the sampler's draws for the positions kept. A repair sends it to the
 * stages that kept their peer; a client sends it to continue a kept session with a new prompt
 * (KV reuse across chat turns), then with the new turn's sampler settings and logprobs.
 */
export type RewindBody = v.InferOutput<typeof rewindSchema>;

/** A Rewind frame's JSON body, checked: BAD_REQUEST naming the field. */
export function parseRewind(body: unknown): RewindBody {
  return validate(rewindSchema, body, 'rewind', 'BAD_REQUEST');
}

/**
 * The session's settings once a Rewind continued it: the rewind's sampler and logprobs from
 * now on (logprobs null: none), and a penalty history started afresh when it carries tokens.
 * One rule for the session manager and for a client's own record of the session.
 */
export function continuedBody(open: SessionOpenBody, rewind: RewindBody): SessionOpenBody {
  return { ...open, ...(rewind.sampler ? { sampler: rewind.sampler } : {}), ...(rewind.logprobs !== undefined ? { logprobs: rewind.logprobs ?? undefined } : {}), ...(rewind.tokens ? { tokens: [] } : {}) };
}

const resendSchema = v.object({ end: count, maxTokens: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(1 << 24)), 1) });
/** Body of a Resend frame: resend positions [frame position, end), at most `maxTokens` per frame (1: as they were sent). */
export type ResendBody = v.InferOutput<typeof resendSchema>;

/** A Resend frame's JSON body, checked: BAD_REQUEST naming the field. */
export function parseResend(body: unknown): ResendBody {
  return validate(resendSchema, body, 'resend', 'BAD_REQUEST');
}

const positions = v.tuple([count, count]);
const statusQuerySchema = v.object({ sentHashes: v.optional(positions), receivedHashes: v.optional(positions) });
/** What a Status request for one session may ask besides the counters: row hashes of what the stage sent or received, for positions [a, b). */
export type StatusQuery = v.InferOutput<typeof statusQuerySchema>;

/** A session Status frame's JSON body, checked: BAD_REQUEST naming the field. */
export function parseStatusQuery(body: unknown): StatusQuery {
  return validate(statusQuerySchema, body, 'status query', 'BAD_REQUEST');
}

/** The frame bodies a stage reads, by name, with their schemas (the fuzzer in test/hardening walks this). */
export const SESSION_BODIES = { 'session open': sessionOpenSchema, rewind: rewindSchema, resend: resendSchema, 'status query': statusQuerySchema } as const;

/** A fresh 128-bit session id in hex (crypto.getRandomValues: Node and browsers alike). */
export function newSessionId(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  let hex = '';
  for (const x of b) hex += x.toString(16).padStart(2, '0');
  return hex;
}
