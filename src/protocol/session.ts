// The session-open schema every side reads: the client (CLI, OpenAI API, page) writes it into
// a SessionOpen frame's JSON body, the server's session manager and every stage read it back.
// Session ids are 128 random bits, hex, as the frame header carries them.

import * as v from 'valibot';
import { count, validate } from './validate.ts';

/** The largest context a session may declare; the route's model caps it further. */
export const MAX_CONTEXT_LENGTH = 1 << 24;

const samplerSchema = v.object({
  temperature: v.optional(v.pipe(v.number(), v.finite(), v.minValue(0), v.maxValue(100))),
  topK: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(1 << 24))),
  topP: v.optional(v.pipe(v.number(), v.finite(), v.minValue(0), v.maxValue(1))),
  seed: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0xffffffff))),
});
/** Sampling on the last stage; absent or temperature 0 is greedy. */
export type SamplerSettings = v.InferOutput<typeof samplerSchema>;

export const sessionOpenSchema = v.object({
  contextLength: v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(MAX_CONTEXT_LENGTH)),
  sampler: v.optional(samplerSchema),
  /** how hidden states travel between stages (default f16) */
  hiddenDtype: v.optional(v.picklist(['f16', 'f32'])),
  /** prompt tokens the client will prefill, for progress reports */
  promptLength: v.optional(count),
  /** random draws the session's sampler has made already: a replacement last stage skips them, so seeded sampling continues as it would have */
  draws: v.optional(count),
});
/** Body of a SessionOpen frame. */
export type SessionOpenBody = v.InferOutput<typeof sessionOpenSchema>;

/** A SessionOpen frame's JSON body, checked: BAD_REQUEST naming the field. */
export function parseSessionOpen(body: unknown): SessionOpenBody {
  return validate(sessionOpenSchema, body, 'session open', 'BAD_REQUEST');
}

const rewindSchema = v.object({ draws: count });
/** Body of a Rewind frame: the sampler's draws for the positions kept. */
export type RewindBody = v.InferOutput<typeof rewindSchema>;

/** A Rewind frame's JSON body, checked: BAD_REQUEST naming the field. */
export function parseRewind(body: unknown): RewindBody {
  return validate(rewindSchema, body, 'rewind', 'BAD_REQUEST');
}

const resendSchema = v.object({ end: count, maxTokens: v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(1 << 24)) });
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
