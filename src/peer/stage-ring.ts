// Stage 0's side of the ring (FrameFlag.Ring): the session manager sends a decode step ahead,
// flagged AwaitsToken, before the token it computes exists; the last stage, once it has sampled
// that token, sends it here (ringTokenFrame: a Ring-flagged Status). The two meet in whichever order they arrive — the
// step waits for its token, or a token waits (boundedly) for its step.

import { MeshError } from '../errors.ts';
import { DType, FrameFlag, FrameType, makeFrame } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeJson, encodeJson } from '../protocol/payload.ts';
import type { Addressing } from '../protocol/payload.ts';

/** Tokens kept for steps not yet here, per stage: beyond it the oldest go (a step that comes later waits on). */
const MAX_EARLY_TOKENS = 256;

export class RingInbox {
  /** steps waiting for their token, by `${session}:${position}` */
  private waiting = new Map<string, { resolve: (token: number) => void; reject: (e: MeshError) => void }>();
  /** tokens that came before their step, by the same keys */
  private early = new Map<string, number>();

  /** The token for the step at (session, position): one already here, or the one the last stage sends next. */
  tokenFor(sessionId: string, position: number): Promise<number> {
    const key = `${sessionId}:${position}`;
    const token = this.early.get(key);
    if (token !== undefined) {
      this.early.delete(key);
      return Promise.resolve(token);
    }
    if (this.waiting.has(key)) return Promise.reject(new MeshError('POSITION_MISMATCH', `session ${sessionId}: a ring step for position ${position} is already waiting for its token`, { got: position }));
    return new Promise((resolve, reject) => this.waiting.set(key, { resolve, reject }));
  }

  /** A ring token frame (ringTokenFrame) for a session at ring generation `generation`: taken when of that generation; false when stale. */
  accept(f: Frame, generation: number): boolean {
    const body = decodeJson<{ token?: unknown; generation?: unknown }>(f.payload);
    if (!Number.isInteger(body.token) || (body.token as number) < 0) throw new MeshError('BAD_REQUEST', `ring token: token must be a token id, got ${JSON.stringify(body.token)}`, { field: 'token' });
    if (body.generation !== generation) return false; // sent before a rewind the session manager made since
    this.arrived(f.sessionId, f.position, body.token as number);
    return true;
  }

  /** The last stage's token for position `position` of the session. */
  arrived(sessionId: string, position: number, token: number): void {
    const key = `${sessionId}:${position}`;
    const w = this.waiting.get(key);
    if (w) {
      this.waiting.delete(key);
      w.resolve(token);
      return;
    }
    this.early.set(key, token);
    if (this.early.size > MAX_EARLY_TOKENS) this.early.delete(this.early.keys().next().value!);
  }

  /** The session rewound to `from` (closed: 0): its steps from there on fail with `why`, its tokens from there on go. */
  drop(sessionId: string, from: number, why: MeshError): void {
    const hit = (key: string): boolean => key.startsWith(`${sessionId}:`) && Number(key.slice(sessionId.length + 1)) >= from;
    for (const [key, w] of [...this.waiting]) {
      if (!hit(key)) continue;
      this.waiting.delete(key);
      w.reject(why);
    }
    for (const key of [...this.early.keys()]) if (hit(key)) this.early.delete(key);
  }

  /** steps waiting for their token, tokens waiting for their step */
  get pending(): { steps: number; tokens: number } {
    return { steps: this.waiting.size, tokens: this.early.size };
  }
}

/** The last stage's token for stage 0: a Ring-flagged Status at the token's position, `{token, generation}`. */
export function ringTokenFrame(at: Addressing, position: number, token: number, generation: number): Frame {
  return makeFrame({ type: FrameType.Status, ...at, position, flags: FrameFlag.Ring, dtype: DType.Json, payload: encodeJson({ token, generation }) });
}
