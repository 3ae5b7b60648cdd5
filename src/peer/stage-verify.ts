// Speculative decoding on a stage (FrameFlag.Verify, docs/protocol.md). The session manager
// sends the token it has and k drafts as one sampled Prefill; every stage computes all k + 1
// positions (their KV written), and the last stage answers the greedy token after each. The
// drafts the session manager then rejects are dropped by the next Verify frame itself: a stage
// holding positions past that frame's start, all of them written past an earlier Verify frame's
// first token, forgets them before computing — so the rollback travels in order with the step
// on every hop and costs no round trip of its own. Positions a plain frame wrote are never
// dropped so (a Verify frame there is POSITION_MISMATCH, as any frame at the wrong position).

import type { HiddenRows, StageBackend, StageInput } from '../backends/types.ts';
import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, payloadBody, tokensFrame } from '../protocol/payload.ts';
import type { ReplayLog } from './replay-log.ts';
import type { SpotCheck } from './spot-check.ts';
import { frameChunk, inputSlice } from './stage-input.ts';

type Input = StageInput | HiddenRows;

/** What of a stage's session a Verify frame changes. */
export interface VerifySession {
  /** positions from here on were written as drafts by the last Verify frame (Infinity: none) */
  tentative: number;
  log: ReplayLog;
  /** the penalties' history (cut with the positions) */
  history: number[];
}

/** A session's positions from `position` on are forgotten: KV (the spot check's too), the output log, the penalty history (a Rewind, rejected drafts). */
export async function forgetFrom(sessionId: string, position: number, s: Omit<VerifySession, 'tentative'>, backend: StageBackend, spotCheck: SpotCheck | undefined): Promise<void> {
  await backend.truncateSession(sessionId, position);
  await spotCheck?.rewind(sessionId, position);
  s.log.truncate(position);
  s.history.length = Math.min(s.history.length, position);
}

/** Before a Verify frame's forward: the rejected drafts at [f.position, held) go; the frame's own drafts become the tentative positions. */
export async function dropRejected(f: Frame, s: VerifySession, backend: StageBackend, spotCheck: SpotCheck | undefined): Promise<void> {
  const held = backend.sessionStats(f.sessionId).position;
  if (held > f.position && f.position >= s.tentative) await forgetFrom(f.sessionId, f.position, s, backend, spotCheck);
  s.tentative = f.position + 1;
}

/**
 * The last stage's answer to a Verify frame: each of its rows computed and sampled as a one-token
 * step of its own (`step`: the stage's plain sampled step), exactly as plain decoding computes
 * them — the same logits and tokens on every backend — and their tokens as one Token frame with
 * the Verify flag at start + count: token i follows position start + i.
 */
export async function verifyAnswer(f: Frame, input: Input, step: (row: Frame, rowInput: Input) => Promise<Frame>): Promise<Frame> {
  const tokens: number[] = [];
  for (let i = 0; i < f.nTokens; i++) {
    const answer = await step({ ...frameChunk(f, i, 1), flags: FrameFlag.Sample }, inputSlice(input, f.nTokens, i, 1));
    tokens.push(decodeI32(payloadBody(answer))[0]!);
  }
  return tokensFrame(FrameType.Token, { routeId: f.routeId, sessionId: f.sessionId }, f.position + f.nTokens, tokens, FrameFlag.Verify);
}

/** Whether the last stage answers `f` as a Verify frame (a repair's replay computes only). */
export function verifies(f: Frame): boolean {
  return (f.flags & FrameFlag.Verify) !== 0 && (f.flags & FrameFlag.Replay) === 0;
}
