// The session manager's eye on its routes' speed: every single-token decode step it sends asks
// the stages for their timing records (FrameFlag.WantTimings, taken off the answer again where
// the client did not ask; a logits step only where it did: the trailer would copy the logits on
// every stage), and a step that no other one-token frame of the route overlapped — so no stage
// can have batched it with another session's (peer/stage-forward.ts: a stage's queue batches
// one-token frames waiting together) — is told to its route with each stage's record
// (RouteHandle.observeStep: the server refreshes each peer's decode figure from them,
// signaling-server/live-speed.ts). Frames of more tokens — prefill chunks, Verify frames with
// drafts — never batch, and leave decode steps alone.

import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { payloadBody, timingsOf } from '../protocol/payload.ts';
import type { StepTiming } from '../protocol/payload.ts';

/** What the observer needs of a route. */
export interface ObservedRoute {
  readonly id: number;
  /** a single-token decode step that ran alone on the route: one timing record per stage */
  observeStep?(records: readonly StepTiming[]): void;
}

interface Mark {
  alone: boolean;
}

export class StepObserver {
  /** the one-token frames in flight, by route */
  private readonly inFlight = new Map<number, Set<Mark>>();

  /** Sends `f` with `send`; a single-token decode step is timed and, when it ran alone, reported to `route`. */
  async run(route: ObservedRoute, f: Frame, send: (f: Frame) => Frame | Promise<Frame>): Promise<Frame> {
    // a one-token frame is what a stage's queue may batch with other sessions' (peer/stage-forward.ts)
    if (f.nTokens !== 1) return send(f);
    // (a trailer on a logits reply is a copy of the logits on every stage: only where the client asked)
    const observe = route.observeStep && f.type === FrameType.Decode && !(f.flags & FrameFlag.Verify) && (!(f.flags & FrameFlag.WantLogits) || f.flags & FrameFlag.WantTimings);
    // every one in flight marks the others: any of them may have batched with another
    let marks = this.inFlight.get(route.id);
    if (!marks) this.inFlight.set(route.id, (marks = new Set()));
    const mark: Mark = { alone: marks.size === 0 };
    for (const m of marks) m.alone = false;
    marks.add(mark);
    let answer: Frame;
    try {
      answer = await send(observe ? { ...f, flags: f.flags | FrameFlag.WantTimings } : f);
    } finally {
      marks.delete(mark);
      if (marks.size === 0) this.inFlight.delete(route.id);
    }
    if (!observe) return answer;
    const records = timingsOf(answer);
    if (mark.alone && records.length > 0) route.observeStep!(records);
    // a client that did not ask for timings gets the answer as it would have come
    return f.flags & FrameFlag.WantTimings || !(answer.flags & FrameFlag.Timings) ? answer : { ...answer, flags: answer.flags & ~FrameFlag.Timings, payload: payloadBody(answer) };
  }
}
