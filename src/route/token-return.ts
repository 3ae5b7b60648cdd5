// The session manager's side of the one-way token path (FrameFlag.ReturnDirect): a sampled
// step goes into stage 0 flagged, its answer is the Token the last stage sends one-way (or an
// Error any stage sends so), matched by session id and position after the step; the chain's
// own Status answers only say the frame was passed on.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { errorFromFrame, payloadBody, timingsOf, withTimings } from '../protocol/payload.ts';
import type { FrameLink } from '../transport/link.ts';

/**
 * A one-way token's timing records read as the climbing path's (downstream = everything after
 * the stage, handle includes it). The records went forward before anything downstream happened,
 * and no two stages share a clock, so the step's wire time is measured here as a whole — the
 * step's time minus every stage's handling — and shared over its N + 1 hops (server → stage 0,
 * stage k → k + 1, last stage → server): in proportion to `hopMs`, each hop's estimated one-way
 * latency where the route knows them (a LAN hop behind a far server then gets its sliver, not a
 * third of the server's round trip), else evenly; then, from the last stage up, downstream_k =
 * its hop + handle_{k+1} and handle_k grows by downstream_k (the last stage's downstream is its
 * return hop), so the usual breakdown reads one hop as each stage's transfer and its overhead
 * stays its own. `wireMs`, where given, gets each stage's hop share added (ms, by stage).
 */
export function withHopShares(token: Frame, stepMs: number, hopMs?: readonly number[], wireMs?: number[]): Frame {
  const records = [...timingsOf(token)].sort((a, b) => a.stage - b.stage);
  if (records.length === 0) return token;
  const handled = records.reduce((a, r) => a + r.handleUs, 0);
  const wireUs = Math.max(0, stepMs * 1000 - handled);
  const hops = records.length + 1;
  const known = hopMs?.length === hops && hopMs.every((ms) => Number.isFinite(ms) && ms >= 0) ? hopMs : null;
  const total = known ? known.reduce((a, b) => a + b, 0) : 0;
  const share = (hop: number): number => (known && total > 0 ? (wireUs * known[hop]!) / total : wireUs / hops);
  let after = 0; // the next stage's handle time, downstream included
  for (let i = records.length - 1; i >= 0; i--) {
    const hopUs = share(i + 1);
    if (wireMs) wireMs[records[i]!.stage] = (wireMs[records[i]!.stage] ?? 0) + hopUs / 1000;
    const downstreamUs = hopUs + after;
    records[i] = { ...records[i]!, downstreamUs, handleUs: records[i]!.handleUs + downstreamUs };
    after = records[i]!.handleUs;
  }
  return withTimings({ ...token, flags: token.flags & ~FrameFlag.Timings, payload: payloadBody(token) }, records);
}

export class DirectReturns {
  /** one-way answers awaited, by `${sessionId}:${position after the step}` */
  private waiting = new Map<string, { resolve: (token: Frame) => void; reject: (e: Error) => void }>();

  /**
   * Sends step `f` into stage 0 with ReturnDirect; resolves with the one-way Token, or rejects
   * with the chain's or a stage's error — or STAGE_LOST when `lost` is told of a lost stage
   * (the answer may then never come; the repair sends the step again).
   */
  send(entry: FrameLink, f: Frame, lost: Set<(stage?: number) => void>, routeId: number, hopMs?: readonly number[], wireMs?: number[]): Promise<Frame> {
    const key = `${f.sessionId}:${f.position + f.nTokens}`;
    const sent = performance.now();
    let onLost = (_stage?: number): void => undefined;
    const returned = new Promise<Frame>((resolve, reject) => {
      this.waiting.set(key, { resolve: (token) => resolve(withHopShares(token, performance.now() - sent, hopMs, wireMs)), reject });
      // the stage named: the step's own error is what the client shows when no repair follows
      onLost = (stage) =>
        reject(
          stage === undefined
            ? new MeshError('STAGE_LOST', `session ${f.sessionId}: a stage of route ${routeId} was lost during the step at position ${f.position}`)
            : new MeshError('STAGE_LOST', `session ${f.sessionId}: stage ${stage} of route ${routeId} was lost during the step at position ${f.position}`, { stage }),
        );
      lost.add(onLost);
    });
    // the chain's answer is a Status (or, from a last stage with no way to us, the token itself)
    const acked = entry.request({ ...f, flags: f.flags | FrameFlag.ReturnDirect }).then((ack) => (ack.type === FrameType.Status ? returned : ack));
    return Promise.race([returned, acked]).finally(() => {
      this.waiting.delete(key);
      lost.delete(onLost);
    });
  }

  /** The step of `sessionId` ending at `end` will never be answered (a ring step dropped): its wait fails with `why`. */
  cancel(sessionId: string, end: number, why: MeshError): void {
    const key = `${sessionId}:${end}`;
    this.waiting.get(key)?.reject(why);
    this.waiting.delete(key);
  }

  /** A one-way answer: the last stage's Token, or a stage's Error; false when no step waits for it. */
  deliver(frame: Frame): boolean {
    const key = `${frame.sessionId}:${frame.position}`;
    const w = this.waiting.get(key);
    if (!w || (frame.type !== FrameType.Token && frame.type !== FrameType.Error)) return false;
    this.waiting.delete(key);
    if (frame.type === FrameType.Error) w.reject(errorFromFrame(frame));
    else w.resolve(frame);
    return true;
  }
}
