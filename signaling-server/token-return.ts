// A stage's one-way answer (a `return` control message: FrameFlag.ReturnDirect, docs/protocol.md)
// on its way to the session manager: a Token only from the route's last stage (only it
// samples), an Error from any of its stages.

import { decodeFrame, FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { fromBase64 } from '../src/protocol/control.ts';

/** What of a room and its route this needs (room.ts passes itself; no import back). */
export interface ReturnRoom {
  log(line: string): void;
  readonly sessions: { deliverReturn(f: Frame): boolean };
}

export function deliverReturn(room: ReturnRoom, r: { id: number; stages: readonly unknown[] }, stage: number, frame: string): void {
  try {
    const f = decodeFrame(fromBase64(frame));
    if (f.type === FrameType.Token && stage !== r.stages.length - 1) return room.log(`route ${r.id}: stage ${stage} sent a token, but only the last stage samples; ignored`);
    if (f.routeId === r.id) room.sessions.deliverReturn(f);
  } catch (e) {
    room.log(`route ${r.id}: a bad one-way answer from stage ${stage}: ${(e as Error).message}`);
  }
}
