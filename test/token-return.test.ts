// The one-way token path's waiting side (src/route/token-return.ts): a step sent with
// ReturnDirect is answered by the Token the last stage sends on its own, and when a stage is
// lost meanwhile the step fails naming that stage — the error a chat shows when no repair
// follows (test/e2e-ui-room.test.ts drives the same through three tabs).
import { describe, expect, it } from 'vitest';
import { MeshError } from '../src/errors.ts';
import { FrameFlag, FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { jsonFrame, timingsOf, tokensFrame, withTimings } from '../src/protocol/payload.ts';
import { DirectReturns, withHopShares } from '../src/route/token-return.ts';
import { stepBreakdown } from '../src/route/telemetry.ts';
import type { FrameLink } from '../src/transport/link.ts';

const at = { routeId: 1, sessionId: 'ab'.repeat(16) };

/** Stage 0 as the session manager sees it: it acknowledges a ReturnDirect step with a Status. */
function entryStage(seen: Frame[]): FrameLink {
  return {
    remote: 'stage 0',
    request: async (f) => {
      seen.push(f);
      return jsonFrame(FrameType.Status, at, { passedOn: true });
    },
    close: async () => undefined,
  };
}

describe('one-way token returns', () => {
  it('resolves a step with the Token the last stage returns at its position', async () => {
    const returns = new DirectReturns();
    const seen: Frame[] = [];
    const lost = new Set<(stage?: number) => void>();
    const step = returns.send(entryStage(seen), tokensFrame(FrameType.Decode, at, 7, [42], FrameFlag.Sample), lost, 1);
    await Promise.resolve();
    expect(seen[0]!.flags & FrameFlag.ReturnDirect).toBeTruthy();
    expect(returns.deliver(tokensFrame(FrameType.Token, at, 99, [5]))).toBe(false); // no step waits at 99
    expect(returns.deliver(tokensFrame(FrameType.Token, at, 8, [5]))).toBe(true);
    expect((await step).type).toBe(FrameType.Token);
    expect(lost.size).toBe(0);
  });

  it('fails a waiting step with STAGE_LOST naming the stage that was lost', async () => {
    const returns = new DirectReturns();
    const lost = new Set<(stage?: number) => void>();
    const step = returns.send(entryStage([]), tokensFrame(FrameType.Decode, at, 7, [42], FrameFlag.Sample), lost, 1);
    for (const wake of lost) wake(2);
    const err = (await step.catch((e: unknown) => e)) as MeshError;
    expect(err.code).toBe('STAGE_LOST');
    expect(err.message).toMatch(/stage 2 of route 1 was lost during the step at position 7/);
    expect(err.details).toMatchObject({ stage: 2 });
    expect(lost.size).toBe(0);
  });

  it('says a stage was lost without guessing which when nobody knows', async () => {
    const returns = new DirectReturns();
    const lost = new Set<(stage?: number) => void>();
    const step = returns.send(entryStage([]), tokensFrame(FrameType.Decode, at, 3, [1], FrameFlag.Sample), lost, 4);
    for (const wake of lost) wake();
    const err = (await step.catch((e: unknown) => e)) as MeshError;
    expect(err.message).toMatch(/a stage of route 4 was lost/);
    expect(err.details?.stage).toBeUndefined();
  });

  it('shares a step\'s wire time over its hops by their known latencies, evenly where none are known', () => {
    // two stages that each handled the step for 1 ms, in a 62.5 ms step: 60.5 ms on the wire
    const rec = (stage: number) => ({ stage, position: 7, computeUs: 800, downstreamUs: 0, handleUs: 1000, queueUs: 0, bytesIn: 10, bytesOut: 10 });
    const token = withTimings(tokensFrame(FrameType.Token, at, 8, [5]), [rec(0), rec(1)]);
    const transfers = (f: Frame) => stepBreakdown(timingsOf(f)).map((s) => s.transferMs);
    // server → stage 0 and the return hop 30 ms each (a far server), stage 0 → 1 0.25 ms (one LAN)
    const weighted = withHopShares(token, 62.5, [30, 0.25, 30]);
    expect(transfers(weighted)[0]).toBeCloseTo((60.5 * 0.25) / 60.25, 2);
    const records = timingsOf(weighted).sort((a, b) => a.stage - b.stage);
    expect(records[1]!.downstreamUs / 1000).toBeCloseTo((60.5 * 30) / 60.25, 2); // the last stage's downstream: its return hop
    expect(records[0]!.handleUs / 1000).toBeCloseTo(62.5 - (60.5 * 30) / 60.25, 1); // stage 0's handle: the whole step but the hop into it
    // the session's tally of each stage's hop share (its hops' wire time in GET /v1/sessions/{id})
    const wire: number[] = [];
    withHopShares(token, 62.5, [30, 0.25, 30], wire);
    expect(wire[0]).toBeCloseTo((60.5 * 0.25) / 60.25, 6);
    expect(wire[1]).toBeCloseTo((60.5 * 30) / 60.25, 6);
    // no (or unusable) latencies: a third each
    for (const hopMs of [undefined, [30, Number.NaN, 30], [1, 2]]) expect(transfers(withHopShares(token, 62.5, hopMs))[0]).toBeCloseTo(60.5 / 3, 2);
  });
});
