// The session-open schema every side reads: the client (CLI, OpenAI API, page) writes it into
// a SessionOpen frame's JSON body, the server's session manager and every stage read it back.
// Session ids are 128 random bits, hex, as the frame header carries them.

import type { SamplerOptions } from '../model/sampler.ts';

/** Sampling on the last stage (llama.cpp's chain: model/sampler.ts's options, JSON as they travel); absent or temperature 0 is greedy. */
export type SamplerSettings = SamplerOptions;

/** Body of a SessionOpen frame. */
export interface SessionOpenBody {
  contextLength: number;
  sampler?: SamplerSettings;
  /** how hidden states travel between stages (default f16) */
  hiddenDtype?: 'f16' | 'f32';
  /** prompt tokens the client will prefill, for progress reports */
  promptLength?: number;
  /** random draws the session's sampler has made already: a replacement last stage skips them, so seeded sampling continues as it would have */
  draws?: number;
  /**
   * the session's token ids from position 0 on, as far as the client knows them (the prompt;
   * on a replacement stage, every token fed so far): the last stage's penalties read them.
   * Sent only when a penalty is on.
   */
  tokens?: number[];
  /** the last stage answers each sampled token with its log-probability and this many top alternatives (0–20); absent: no log-probabilities */
  logprobs?: number;
  /** how the sampled token reaches the session manager: 'direct' (default, where every stage takes it: the last stage sends it one-way) or 'climb' (back up through every stage) */
  tokenPath?: 'direct' | 'climb';
}

/**
 * Body of a Rewind frame: the sampler's draws for the positions kept. A repair sends it to the
 * stages that kept their peer; a client sends it to continue a kept session with a new prompt
 * (KV reuse across chat turns), then with the new turn's sampler settings and logprobs.
 */
export interface RewindBody {
  draws: number;
  /** the token ids from position `from` (default: the rewind position) on, as far as the client knows them (penalty history; see SessionOpenBody.tokens) */
  tokens?: number[];
  from?: number;
  /** new sampler settings from now on (a new turn's) */
  sampler?: SamplerSettings;
  /** new log-probability setting from now on (null: none) */
  logprobs?: number | null;
}

/** Body of a Resend frame: resend positions [frame position, end), at most `maxTokens` per frame (1: as they were sent). */
export interface ResendBody {
  end: number;
  maxTokens: number;
}

/** A fresh 128-bit session id in hex (crypto.getRandomValues: Node and browsers alike). */
export function newSessionId(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  let hex = '';
  for (const x of b) hex += x.toString(16).padStart(2, '0');
  return hex;
}
