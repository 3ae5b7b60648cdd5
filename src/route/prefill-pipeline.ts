// Pipelined prefill on the session manager's side. A prefill chunk nobody waits on (no Sample,
// no WantLogits) goes into stage 0 and is answered to the client at once, so the client's next
// chunk is already on stage 0's link while stage 0 computes this one — and each stage passes
// such a chunk on as soon as it has computed it (peer/stage-service.ts), so stage k + 1
// computes chunk j while stage k computes chunk j + 1: a long prompt costs about the slowest
// stage's share, not the sum of all. Nothing else has to wait: one session's frames keep their
// order on every link and in every stage's lane. The chunks' own answers are collected here;
// the next step that waits for an answer (the sampled last chunk, a decode, a rewind) meets any
// chunk's failure first, and that fails or repairs the session as its own failure would. A
// repair replays every unconfirmed chunk from the session's history, so what was in flight is
// forgotten then; a chunk that comes while a failure or a repair is pending is only recorded in
// the history (the repair's replay sends it).

import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { jsonFrame, replyAddress } from '../protocol/payload.ts';
import { replacedStages } from './repair.ts';
import type { FrameLink } from '../transport/link.ts';

/** What a chunk needs of the route (session-types.ts RouteHandle has it). */
interface ChunkRoute {
  entry(): FrameLink;
  stagePeers(): string[];
  repair?(): unknown;
}

/** What a pipelined chunk's client is told: passed on, not yet computed anywhere (repair.ts reachedLastStage reads `pipelined`). */
export function pipelinedAnswer(f: Frame): Frame {
  return jsonFrame(FrameType.Status, replyAddress(f), { stage: 0, position: f.position + f.nTokens, pipelined: true, queued: true });
}

export class PrefillPipeline {
  /** answers of chunks in flight */
  private readonly pending = new Set<Promise<void>>();
  /** the first chunk's failure since the last drain or reset */
  private failure: unknown = null;
  /** bumped by reset(): answers of chunks sent before it are ignored */
  private epoch = 0;
  /** chunks sent into stage 0 without waiting, over the session's life (status, tests) */
  sent = 0;

  /** Whether frame `f` is a prefill chunk nobody waits on, and the route's stage 0 handles frames in the order they are sent. */
  static takes(f: Frame, route: ChunkRoute): boolean {
    if (f.type !== FrameType.Prefill || (f.flags & (FrameFlag.Sample | FrameFlag.WantLogits | FrameFlag.Replay)) !== 0) return false;
    try {
      return route.entry().ordered === true;
    } catch {
      return false; // no entry now: the step waits (and meets the route's state) as any other
    }
  }

  /** Whether a chunk failed and no step has met the failure yet. */
  get failed(): boolean {
    return this.failure !== null;
  }

  /**
   * Sends chunk `f` into the route's stage 0 and answers at once; its own answer is kept for the
   * next waiting step. While a failure or a repair is pending nothing is sent (the history has it).
   */
  send(route: ChunkRoute, sessionPeers: readonly string[], f: Frame): Frame {
    if (!this.failed && !route.repair?.() && replacedStages(sessionPeers, route.stagePeers()).length === 0) {
      let reply: Promise<Frame>;
      try {
        reply = route.entry().request(f);
      } catch (e) {
        reply = Promise.reject(e);
      }
      this.track(reply);
      this.sent++;
    }
    return pipelinedAnswer(f);
  }

  private track(reply: Promise<Frame>): void {
    const epoch = this.epoch;
    const p: Promise<void> = reply.then(
      () => undefined,
      (e: unknown) => {
        if (epoch === this.epoch) this.failure ??= e;
      },
    );
    this.pending.add(p);
    void p.finally(() => this.pending.delete(p));
  }

  /** Resolves once every chunk in flight was answered; rejects with the first chunk's failure (which is then forgotten). */
  async drain(): Promise<void> {
    while (this.pending.size > 0) await Promise.all([...this.pending]);
    const failure = this.failure;
    this.failure = null;
    if (failure !== null) throw failure;
  }

  /** Resolves once no chunk is in flight (a hand-over waits for this); never rejects. */
  async idle(): Promise<void> {
    while (this.pending.size > 0) await Promise.all([...this.pending]);
  }

  /**
   * A waiting step's answer, after every chunk before it: the step is sent at once (it queues
   * behind the chunks on stage 0's link) unless a chunk already failed; a chunk's failure is the
   * step's failure (it explains the step's best).
   */
  after(send: () => Promise<Frame>): Promise<Frame> {
    if (this.failed) return this.drain().then(send);
    const reply = send();
    reply.catch(() => undefined); // a chunk's failure is reported instead
    return this.drain().then(() => reply);
  }

  /** A repair replays every unconfirmed chunk from the history: forget the ones in flight. */
  reset(): void {
    this.epoch++;
    this.pending.clear();
    this.failure = null;
  }
}
