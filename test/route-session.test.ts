import { describe, expect, it } from 'vitest';
import { canTransition, isTerminal, SessionLifecycle } from '../src/route/session-state.ts';
import type { SessionState } from '../src/route/session-state.ts';
import { isMeshError } from '../src/errors.ts';

const ALL: SessionState[] = ['opening', 'prefilling', 'decoding', 'idle', 'repairing', 'closed', 'expired', 'failed'];

describe('session state machine', () => {
  it('allows exactly the documented transitions', () => {
    const allowed = new Set([
      'opening>idle', 'opening>closed', 'opening>failed',
      'idle>prefilling', 'idle>decoding', 'idle>closed', 'idle>expired', 'idle>failed',
      'prefilling>idle', 'prefilling>closed', 'prefilling>failed',
      'decoding>idle', 'decoding>closed', 'decoding>failed',
      // a lost stage: the session is rebuilt on the replacement, then goes back where it was
      'idle>repairing', 'prefilling>repairing', 'decoding>repairing',
      'repairing>idle', 'repairing>prefilling', 'repairing>decoding', 'repairing>closed', 'repairing>failed',
    ]);
    for (const a of ALL) for (const b of ALL) expect(canTransition(a, b), `${a} → ${b}`).toBe(allowed.has(`${a}>${b}`));
    expect(ALL.filter(isTerminal)).toEqual(['closed', 'expired', 'failed']);
  });

  it('refuses a step that is not allowed with SESSION_BAD_STATE, and steps after the end with the end state', () => {
    const s = new SessionLifecycle('s');
    expect(() => s.begin('decoding')).toThrow(); // still opening
    s.transition('idle');
    s.begin('prefilling');
    try {
      s.begin('decoding');
    } catch (e) {
      expect(isMeshError(e, 'SESSION_BAD_STATE')).toBe(true);
    }
    s.transition('idle');
    s.fail({ code: 'STAGE_LOST', message: 'stage 1 left', stage: 1 });
    try {
      s.begin('decoding');
      throw new Error('not refused');
    } catch (e) {
      expect(isMeshError(e, 'SESSION_FAILED')).toBe(true);
      expect((e as { details: { stage: number } }).details.stage).toBe(1);
    }
    s.fail({ code: 'STAGE_FAILED', message: 'again' }); // failing twice keeps the first failure
    expect(s.failure?.code).toBe('STAGE_LOST');
    expect(s.history).toEqual(['opening', 'idle', 'prefilling', 'idle', 'failed']);
  });
});
