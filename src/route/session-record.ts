// What a client knows of one session it drives over the frame API, kept from the frames it sent
// and the replies it got: the open body, every token frame answered (its history), the sampler
// draws the last stage made, and the token it sampled last. That is enough to open the same
// session again on another route and bring it to the same state (resuming-link.ts): a replay of
// the history, each frame as it was first sent, and a sampler that skips the draws made.

import { FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, decodeJson, decodeSampled, jsonFrame, tokensFrame } from '../protocol/payload.ts';
import type { Addressing } from '../protocol/payload.ts';
import { continuedBody, parseRewind, parseSessionOpen, usesPenalties } from '../protocol/session.ts';
import type { SessionOpenBody } from '../protocol/session.ts';
import { historyBefore, historyTokens } from './repair.ts';
import type { HistoryEntry } from './repair.ts';

export class SessionRecord {
  /** token frames answered, in position order */
  history: HistoryEntry[] = [];
  /** Token replies since the open or the last rewind: the last stage's sampler draws (a greedy sampler ignores them) */
  draws = 0;
  /** the token the last reply sampled, at the position after the history (the last stage's penalty history holds it) */
  lastSampled: number | null = null;
  /** whether the open was answered (else a resume sends the open itself again) */
  opened = false;
  /** the route and session id the session runs under now (the caller's own until a resume) */
  wire: Addressing;

  constructor(
    /** the caller's address of the session (its frames keep naming it) */
    readonly caller: Addressing,
    public body: SessionOpenBody,
  ) {
    this.wire = { ...caller };
  }

  /** A record for an outgoing SessionOpen frame (its body checked as the server would). */
  static fromOpen(f: Frame): SessionRecord {
    return new SessionRecord({ routeId: f.routeId, sessionId: f.sessionId }, parseSessionOpen(decodeJson(f.payload)));
  }

  /** the positions the session holds */
  get position(): number {
    const last = this.history.at(-1);
    return last ? last.position + last.tokens.length : 0;
  }

  /** Learns from request `f` answered with `reply` (not an error). */
  answered(f: Frame, reply: Frame): void {
    switch (f.type) {
      case FrameType.SessionOpen:
        this.opened = true;
        return;
      case FrameType.Prefill:
      case FrameType.Decode: {
        this.history.push({ type: f.type, position: f.position, tokens: decodeI32(f.payload), flags: 0 });
        const sampled = reply.type === FrameType.Token;
        if (sampled) this.draws++;
        this.lastSampled = sampled ? decodeSampled(reply).token : null;
        return;
      }
      case FrameType.Rewind: {
        // as the session manager does: the history cut, the sampler restarted (no draws), new settings from now on
        this.history = historyBefore(this.history, f.position);
        this.draws = 0;
        this.lastSampled = null;
        this.body = continuedBody(this.body, parseRewind(decodeJson(f.payload)));
        return;
      }
      default:
    }
  }

  /** The SessionOpen that opens the session again under `wire`: its sampler after the draws made, a penalised session's token history. */
  reopenFrame(wire: Addressing): Frame {
    const known = [...historyTokens(this.history, 0), ...(this.lastSampled === null ? [] : [this.lastSampled])];
    const penalised = !!this.body.tokens || (!!this.body.sampler && usesPenalties(this.body.sampler));
    return jsonFrame(FrameType.SessionOpen, wire, { ...this.body, draws: this.draws, ...(penalised ? { tokens: known } : {}) } satisfies SessionOpenBody);
  }

  /**
   * The history again under `wire`, frame by frame as first sent (a backend whose rows depend
   * on the batch then computes the same KV), as prefill frames that sample nothing: no draw is
   * made and a speculating server turns none into a Verify.
   */
  replayFrames(wire: Addressing): Frame[] {
    return this.history.map((h) => tokensFrame(FrameType.Prefill, wire, h.position, h.tokens, 0));
  }
}
