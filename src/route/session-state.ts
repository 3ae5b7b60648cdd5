// The life of one session, as a table of allowed transitions. Every change goes through
// `transition`, so an out-of-order request (a decode before any prefill, a step while another
// is in flight, anything after the end) is refused with SESSION_BAD_STATE instead of
// corrupting a KV cache.
//
//   opening ──▶ idle ◀──▶ prefilling
//                 ▲ └───▶ decoding ──┐
//                 └──────────────────┘
//   idle | prefilling | decoding ──▶ repairing ──▶ back where it was (the route lost a stage:
//                                                  the session is rebuilt on its replacement)
//   any live state ──▶ closed (close/cancel) | failed (a stage failed, no repair in time);
//   idle ──▶ expired (TTL)

import { MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';

export type SessionState = 'opening' | 'prefilling' | 'decoding' | 'idle' | 'repairing' | 'closed' | 'expired' | 'failed';

const NEXT: Record<SessionState, readonly SessionState[]> = {
  opening: ['idle', 'closed', 'failed'],
  idle: ['prefilling', 'decoding', 'repairing', 'closed', 'expired', 'failed'],
  prefilling: ['idle', 'repairing', 'closed', 'failed'],
  decoding: ['idle', 'repairing', 'closed', 'failed'],
  repairing: ['idle', 'prefilling', 'decoding', 'closed', 'failed'],
  closed: [],
  expired: [],
  failed: [],
};

export function isTerminal(s: SessionState): boolean {
  return NEXT[s].length === 0;
}

export function canTransition(from: SessionState, to: SessionState): boolean {
  return NEXT[from].includes(to);
}

export interface SessionFailure {
  code: ErrorCode;
  message: string;
  /** the stage that failed, when one did */
  stage?: number;
}

/** The state of one session plus when it last changed (for idle expiry). */
export class SessionLifecycle {
  state: SessionState = 'opening';
  changedAt = Date.now();
  failure: SessionFailure | null = null;
  readonly history: SessionState[] = ['opening'];

  constructor(readonly sessionId: string) {}

  transition(to: SessionState): void {
    if (!canTransition(this.state, to)) {
      throw new MeshError('SESSION_BAD_STATE', `session ${this.sessionId} is ${this.state}; it cannot become ${to}`, { state: this.state });
    }
    this.state = to;
    this.changedAt = Date.now();
    this.history.push(to);
  }

  fail(failure: SessionFailure): void {
    if (isTerminal(this.state)) return;
    this.failure = failure;
    this.transition('failed');
  }

  /** Throws unless the session is idle and may start `step`. */
  begin(step: 'prefilling' | 'decoding'): void {
    if (isTerminal(this.state)) {
      const why = this.failure ? `: ${this.failure.message}` : '';
      throw new MeshError(this.state === 'failed' ? 'SESSION_FAILED' : 'SESSION_CLOSED', `session ${this.sessionId} is ${this.state}${why}`, {
        state: this.state,
        ...(this.failure?.stage !== undefined ? { stage: this.failure.stage } : {}),
      });
    }
    this.transition(step);
  }
}
