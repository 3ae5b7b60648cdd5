// The session manager's side of the ring (FrameFlag.Ring): with a decode step it sends stage 0
// the next one ahead (AwaitsToken), before the token it computes exists; the last stage sends
// its sampled token to stage 0 as well as here, so the next step starts there at once instead
// of after the token's trip to the server, the client and back — a token costs the chain's
// hops (stage 0 → … → last → stage 0), not the server's two.
//
// The step sent ahead is only a guess that the client goes on with the token it is given. When
// it does (its next decode has that token at that position), the step already running is its
// answer and the next one goes ahead. When it does not — another token (a grammar, a stop), a
// prefill, a rewind — the step ahead is settled first: awaited, and every stage rewound to the
// session's position under a new ring generation, so no token sampled for the dropped step
// (still on its way to stage 0, perhaps) is ever taken. A step ahead that nobody takes costs one
// step of compute; the session's tokens are the ones plain decoding gives.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, tokensFrame } from '../protocol/payload.ts';
import type { FrameLink } from '../transport/link.ts';
import { rewindEveryStage } from './repair.ts';

/** A decode step sent ahead: its position, its one-way answer, and the token it computes once known. */
interface StepAhead {
  position: number;
  answer: Promise<Frame>;
  /** the token the step before it sampled (null until that step's answer came) */
  token: number | null;
  /** the step before it failed: no token is coming */
  orphaned: boolean;
}

/** What the ring did for a session, in its status. */
export interface RingStats {
  /** steps sent ahead, taken as the client's next step, and dropped (with a rewind) */
  sentAhead: number;
  taken: number;
  dropped: number;
}

/** How the ring reaches the route: the one-way send of a step, and every stage's link for the rewinds. */
export interface RingRoute {
  /** sends a sampled step into stage 0 one-way (ReturnDirect added), its answer the one-way Token */
  send(f: Frame): Promise<Frame>;
  stageLinks(): Array<FrameLink | null>;
  /** the last stage's sampler draws confirmed so far (a rewind restarts it there) */
  confirmedDraws(): number;
  /** the step ending at `end` will never be answered: its one-way wait fails with `why` */
  cancel(end: number, why: MeshError): void;
  /** the session's context: no step goes ahead past its last position */
  contextLength: number;
}

/** How long a settle waits for a step ahead to finish before rewinding past it anyway (ms). */
const SETTLE_MS = 30_000;

export class RingAhead {
  readonly stats: RingStats = { sentAhead: 0, taken: 0, dropped: 0 };
  private ahead: StepAhead | null = null;
  /** bumped by every rewind this session's ring makes (stage 0 takes ring tokens of the current one only) */
  private generation = 0;
  /** a ring token did not reach stage 0 (RING_BROKEN): the session goes on one-way */
  private broken = false;

  constructor(
    private readonly routeId: number,
    private readonly sessionId: string,
    private readonly route: RingRoute,
  ) {}

  /** Whether `f` is the step sent ahead: a decode of the token the last answer gave, at its position. */
  takes(f: Frame): boolean {
    const a = this.ahead;
    return !!a && !a.orphaned && f.type === FrameType.Decode && f.position === a.position && a.token !== null && decodeI32(f.payload)[0] === a.token;
  }

  /**
   * Sends decode step `f` on the ring and the next one ahead; resolves with `f`'s Token. When `f`
   * is the step already ahead, it is not sent again: the step ahead is its answer.
   */
  async step(f: Frame): Promise<Frame> {
    const route = this.route;
    if (this.broken) return route.send(f);
    const flags = (f.flags & FrameFlag.WantTimings) | FrameFlag.Sample | FrameFlag.Ring;
    let answer: Promise<Frame>;
    if (this.takes(f)) {
      answer = this.ahead!.answer.catch((e: unknown) => this.oneWayAfter(e, f));
      this.stats.taken++;
    } else {
      await this.settle();
      answer = route.send({ ...f, flags: f.flags | flags });
    }
    if (f.position + 1 >= route.contextLength) {
      this.ahead = null; // the session's last position: nothing goes ahead
      return answer;
    }
    const next: StepAhead = { position: f.position + 1, answer: route.send(tokensFrame(FrameType.Decode, { routeId: this.routeId, sessionId: this.sessionId }, f.position + 1, [0], flags | FrameFlag.AwaitsToken)), token: null, orphaned: false };
    next.answer.catch(() => undefined); // awaited by whoever takes or settles it
    this.ahead = next;
    this.stats.sentAhead++;
    return answer.then(
      (token) => {
        if (token.type === FrameType.Token) next.token = decodeI32(token.payload)[0]!;
        return token;
      },
      (e: unknown) => {
        next.orphaned = true;
        throw e;
      },
    );
  }

  /**
   * Drops the step ahead, if any, so the session's next frame meets stages at its position: waits
   * for the step to finish (bounded: not when the step before it failed), then rewinds every stage
   * to the session's position with a new ring generation.
   */
  async settle(): Promise<void> {
    const route = this.route;
    const a = this.ahead;
    if (!a) return;
    this.ahead = null;
    this.stats.dropped++;
    if (!a.orphaned) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([a.answer.catch(() => undefined), new Promise((resolve) => (timer = setTimeout(resolve, SETTLE_MS)))]);
      clearTimeout(timer);
    }
    route.cancel(a.position + 1, this.dropped(a)); // (no-op once it answered)
    await this.rewind(a.position);
  }

  /** Every stage forgets the session's positions from `position` on, under a new ring generation. */
  private async rewind(position: number): Promise<void> {
    this.generation++;
    await rewindEveryStage(this.route.stageLinks(), { routeId: this.routeId, sessionId: this.sessionId }, position, { draws: this.route.confirmedDraws(), ring: this.generation });
  }

  /**
   * The step taken failed: when its token never reached stage 0 (RING_BROKEN), the steps ahead are
   * dropped there and `f` goes one-way, as every later step of the session; any other failure is the step's.
   */
  private async oneWayAfter(e: unknown, f: Frame): Promise<Frame> {
    if (!(e instanceof MeshError) || e.code !== 'RING_BROKEN') throw e;
    this.broken = true;
    this.abandon();
    await this.rewind(f.position);
    return this.route.send({ ...f, flags: f.flags & ~FrameFlag.Ring });
  }

  /** The session closed, failed or was rebuilt by a repair (whose rewinds cover the step ahead): the ring forgets it. */
  abandon(): void {
    const a = this.ahead;
    this.ahead = null;
    if (a) this.route.cancel(a.position + 1, this.dropped(a));
  }

  private dropped(a: StepAhead): MeshError {
    return new MeshError('SESSION_REWOUND', `session ${this.sessionId}: the ring's step ahead at position ${a.position} was dropped`);
  }
}
