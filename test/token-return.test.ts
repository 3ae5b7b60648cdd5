// The one-way token path's waiting side (src/route/token-return.ts): a step sent with
// ReturnDirect is answered by the Token the last stage sends on its own, and when a stage is
// lost meanwhile the step fails naming that stage — the error a chat shows when no repair
// follows (test/e2e-ui-room.test.ts drives the same through three tabs).
import { describe, expect, it } from 'vitest';
import { MeshError } from '../src/errors.ts';
import { FrameFlag, FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { jsonFrame, tokensFrame } from '../src/protocol/payload.ts';
import { DirectReturns } from '../src/route/token-return.ts';
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
});
