// Speculative decoding over the route, where the session manager is: so a route pays its hop
// latency once per accepted run of tokens, not once per token. For a greedy session the manager
// proposes up to k drafts by prompt lookup (the longest recent suffix of the session's own
// tokens that occurred before: what followed it), sends the step's token and the drafts as one
// Verify frame (FrameFlag.Verify), and gets back the greedy token after each position. The
// drafts match those tokens up to some m: the step's answer is the first token, the next m
// come from here without a route pass as the client feeds the tokens before them, and the
// stages keep the accepted positions — the next Verify frame drops the rejected ones on every
// stage on its way (peer/stage-verify.ts). The output is plain greedy decoding's, token for
// token: the last stage computes every verified position as a plain decode step would.
//
// The session's history (what a repair replays) records the accepted tokens only, so a repair
// after a speculative step rebuilds exactly the positions the stages keep; a Verify frame the
// route never answered is sent again as it was, and answers the same.

import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, payloadBody, timingsOf, tokensFrame, withTimings } from '../protocol/payload.ts';
import { MAX_DRAFT_TOKENS, usesPenalties } from '../protocol/session.ts';
import type { RewindBody, SessionOpenBody } from '../protocol/session.ts';
import { MeshError } from '../errors.ts';
import type { FrameLink } from '../transport/link.ts';
import { historyBefore, historyTokens, rewindEveryStage } from './repair.ts';
import type { HistoryEntry } from './repair.ts';

/** What of a session (session-types.ts' Session) speculation reads and keeps true. */
export interface SpeculatingSession {
  readonly route: { readonly id: number; stageLinks(): Array<FrameLink | null>; verify?(): boolean };
  readonly life: { readonly sessionId: string };
  readonly body: { readonly contextLength: number };
  history: HistoryEntry[];
  confirmedEntries: number;
  confirmedPosition: number;
  readonly confirmedDraws: number;
}

/** The longest suffix prompt lookup tries to find earlier in the session's tokens. */
const MAX_NGRAM = 4;

/** What speculation did for a session (its SessionInfo's `speculation`). */
export interface SpeculationStats {
  /** drafts per Verify frame at most */
  draftTokens: number;
  /** decode steps that went through the route (Verify frames and plain steps) */
  passes: number;
  /** drafts sent, and how many of them the route's greedy tokens matched */
  proposed: number;
  accepted: number;
  /** tokens those passes produced (the steps served from accepted drafts included) */
  tokens: number;
}

/**
 * Drafts per route pass for a session: its open body's `speculate`, else the server's default;
 * 0 (off) unless the session samples greedily with nothing that reads more than the logits
 * (temperature 0, no penalties, no logit bias, no log-probabilities).
 */
export function draftTokensFor(body: SessionOpenBody, serverDefault = 0): number {
  const k = Math.min(MAX_DRAFT_TOKENS, body.speculate ?? serverDefault);
  const s = body.sampler ?? {};
  const greedy = (s.temperature ?? 0) <= 0 && !usesPenalties(s) && Object.keys(s.logitBias ?? {}).length === 0 && (body.logprobs ?? null) === null;
  return greedy ? k : 0;
}

/**
 * Prompt lookup: the tokens that followed the most recent earlier occurrence of the longest
 * suffix of `tokens` (at most `maxNgram` long) — at most `k` of them; none when no suffix recurs.
 */
export function proposeDrafts(tokens: readonly number[], k: number, maxNgram = MAX_NGRAM): number[] {
  const n = tokens.length;
  for (let len = Math.min(maxNgram, n - 1); len >= 1; len--) {
    // an occurrence ending just before index `end` (< n - 1: not the suffix itself)
    for (let end = n - 1; end >= len; end--) {
      let i = 0;
      while (i < len && tokens[end - len + i] === tokens[n - len + i]) i++;
      if (i === len) return tokens.slice(end, Math.min(end + k, n));
    }
  }
  return [];
}

/** A verified token the client has not asked for yet: the answer to the Decode feeding `input` at `position`. */
interface Verified {
  position: number;
  input: number;
  answer: number;
}

export class Speculation {
  readonly stats: SpeculationStats;
  private verified: Verified[] = [];
  /** positions the stages may hold (drafts past the session's included) */
  private held = 0;

  constructor(draftTokens: number) {
    this.stats = { draftTokens, passes: 0, proposed: 0, accepted: 0, tokens: 0 };
  }

  /** A session's speculation, or null where it does not speculate (draftTokensFor). */
  static forSession(body: SessionOpenBody, serverDefault?: number): Speculation | null {
    const k = draftTokensFor(body, serverDefault);
    return k > 0 ? new Speculation(k) : null;
  }

  /** The answer to Decode `f` from tokens already verified, or null when it needs the route. */
  served(f: Frame): Frame | null {
    const next = this.verified[0];
    if (f.type !== FrameType.Decode || !next || next.position !== f.position || next.input !== decodeI32(f.payload)[0]) return null;
    this.verified.shift();
    this.stats.tokens++;
    return tokensFrame(FrameType.Token, { routeId: f.routeId, sessionId: f.sessionId }, f.position + 1, [next.answer]);
  }

  /**
   * Before step `f` goes to the route: positions from f.position on that the session holds
   * beyond what the client fed (accepted drafts it will not ask for now, rejected ones on the
   * stages) leave its history; a Verify frame drops them on the stages by itself, any other
   * step needs every stage rewound first (the existing Rewind).
   */
  private async rollBack(s: SpeculatingSession, f: Frame, verifying: boolean): Promise<void> {
    this.verified = [];
    if (s.confirmedPosition > f.position) {
      s.history = historyBefore(s.history, f.position);
      s.confirmedEntries = s.history.length;
      s.confirmedPosition = f.position;
    }
    if (this.held <= f.position || verifying) return;
    const at = { routeId: s.route.id, sessionId: s.life.sessionId };
    const body: RewindBody = { draws: s.confirmedDraws };
    await rewindEveryStage(s.route.stageLinks(), at, f.position, body);
    this.held = f.position;
  }

  /** What goes to the route for step `f` (after rollBack): a sampled decode as a Verify frame where every stage takes them. */
  async prepare(s: SpeculatingSession, f: Frame, maxTokens: number): Promise<Frame> {
    const verifying = f.type === FrameType.Decode && !(f.flags & FrameFlag.WantLogits) && s.route.verify?.() === true;
    await this.rollBack(s, f, verifying);
    return (verifying && this.verifyFrame(s, f, maxTokens)) || f;
  }

  /** The route's answer to `sent`, step `f` as the session sent it: a Verify frame's accepted (accept), a plain decode's counted. */
  answered(s: SpeculatingSession, f: Frame, sent: Frame, reply: Frame): Frame {
    if (sent !== f) return this.accept(s, sent, reply);
    if (f.type === FrameType.Decode) this.passed(f);
    return reply;
  }

  /** Decode `f` as a Verify frame: its token and up to k drafts by prompt lookup over the session's history (null: no drafts and nothing to drop; send `f` as it is). */
  private verifyFrame(s: SpeculatingSession, f: Frame, maxTokens: number): Frame | null {
    const token = decodeI32(f.payload)[0]!;
    const room = Math.min(this.stats.draftTokens, s.body.contextLength - f.position - 1, maxTokens - 1);
    const drafts = room > 0 ? proposeDrafts([...historyTokens(s.history, 0), token], room) : [];
    if (drafts.length === 0 && this.held <= f.position) return null;
    return tokensFrame(FrameType.Prefill, { routeId: f.routeId, sessionId: f.sessionId }, f.position, [token, ...drafts], FrameFlag.Sample | FrameFlag.Verify | (f.flags & FrameFlag.WantTimings));
  }

  /** A plain decode step went through the route. */
  private passed(f: Frame): void {
    this.stats.passes++;
    this.stats.tokens++;
    this.held = f.position + 1;
  }

  /**
   * The route's answer to Verify frame `sent` (s.history's last entry, s.position already past
   * its first token): the drafts the greedy tokens match are accepted — the history keeps them,
   * the stages hold them confirmed — the tokens after them wait for the client's next decodes,
   * and the client's answer is the first token (with the step's timings).
   */
  private accept(s: SpeculatingSession, sent: Frame, reply: Frame): Frame {
    if (reply.type !== FrameType.Token || !(reply.flags & FrameFlag.Verify) || reply.nTokens !== sent.nTokens) {
      throw new MeshError('FRAME_BAD_TYPE', `a Verify frame of ${sent.nTokens} tokens was answered by a ${FrameType[reply.type]} frame of ${reply.nTokens}`);
    }
    const fed = decodeI32(sent.payload);
    const greedy = decodeI32(payloadBody(reply));
    let m = 0;
    while (m < fed.length - 1 && fed[m + 1] === greedy[m]) m++;
    const p = sent.position;
    s.history[s.history.length - 1] = { type: m === 0 ? FrameType.Decode : FrameType.Prefill, position: p, tokens: fed.slice(0, m + 1), flags: FrameFlag.Sample };
    s.confirmedEntries = s.history.length;
    s.confirmedPosition = p + m + 1;
    this.verified = Array.from({ length: m }, (_, i) => ({ position: p + 1 + i, input: greedy[i]!, answer: greedy[i + 1]! }));
    this.held = p + sent.nTokens;
    this.stats.passes++;
    this.stats.proposed += fed.length - 1;
    this.stats.accepted += m;
    this.stats.tokens++;
    const token = tokensFrame(FrameType.Token, { routeId: s.route.id, sessionId: s.life.sessionId }, p + 1, [greedy[0]!]);
    const timings = timingsOf(reply);
    return timings.length > 0 ? withTimings(token, timings) : token;
  }

  /** The client continued the session at `position` (every stage rewound there). */
  reset(position: number): void {
    this.verified = [];
    this.held = position;
  }
}
