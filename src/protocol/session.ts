// The session-open schema every side reads: the client (CLI, OpenAI API, page) writes it into
// a SessionOpen frame's JSON body, the server's session manager and every stage read it back.
// Session ids are 128 random bits, hex, as the frame header carries them.

/** Sampling on the last stage; absent or temperature 0 is greedy. */
export interface SamplerSettings {
  temperature?: number;
  topK?: number;
  topP?: number;
  seed?: number;
}

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
  /** how the sampled token reaches the session manager: 'direct' (default, where every stage takes it: the last stage sends it one-way) or 'climb' (back up through every stage) */
  tokenPath?: 'direct' | 'climb';
}

/** Body of a Rewind frame: the sampler's draws for the positions kept. */
export interface RewindBody {
  draws: number;
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
