// What every carrier offers: a FrameLink sends a request frame and resolves with the reply
// frame (an Error reply becomes a rejected MeshError); a FrameHandler is the other side,
// answering one request frame with one reply frame.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType, NIL_SESSION } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { errorFrame, errorFromFrame, replyAddress } from '../protocol/payload.ts';

export interface FrameLink {
  /** the peer's address, for error messages */
  readonly remote: string;
  request(frame: Frame): Promise<Frame>;
  close(): Promise<void>;
  /**
   * true where frames sent one after another are handled in that order (one connection, one
   * lane per session): a sender may then send a session's next frame before the last one is
   * answered (pipelined prefill). HTTP requests may overtake each other; a LocalLink runs
   * frames side by side.
   */
  readonly ordered?: boolean;
  /** called once when the carrier drops (not after close()) */
  onClose?: ((reason: MeshError) => void) | undefined;
}

/**
 * Where a frame came in, as the carrier knows it: `peer` is the peer id the sending connection
 * declared (`x-mesh-peer` on its WebSocket upgrade or HTTP request), null when it declared none
 * (the signaling server's entry link, an older peer). Absent: not from a listening carrier (the
 * control socket, an in-process link).
 */
export interface FrameOrigin {
  peer: string | null;
}

/** The header a peer names itself in: to a next stage's carriers (FrameOrigin) and to the server's model hosting. */
export const PEER_HEADER = 'x-mesh-peer';

export type FrameHandler = (frame: Frame, origin?: FrameOrigin) => Promise<Frame>;

/** Rejects when the reply is an Error frame; otherwise returns it. */
export function unwrapReply(reply: Frame): Frame {
  if (reply.type === FrameType.Error) throw errorFromFrame(reply);
  return reply;
}

/** The error reply for a thrown value (MeshErrors keep their code and stage). */
export function errorReplyFor(req: Pick<Frame, 'routeId' | 'sessionId' | 'seq'>, e: unknown): Frame {
  const err = e instanceof MeshError ? e : new MeshError('INTERNAL', e instanceof Error ? e.message : String(e));
  const { stage, ...rest } = err.details ?? {};
  return errorFrame(replyAddress(req as Frame), {
    code: err.code,
    message: err.message,
    ...(typeof stage === 'number' ? { stage } : {}),
    ...(Object.keys(rest).length ? { details: rest } : {}),
  });
}

/** Runs a handler so that a throw becomes an Error reply and every reply is marked as one. */
export async function answer(handler: FrameHandler, req: Frame): Promise<Frame> {
  let reply: Frame;
  try {
    reply = await handler(req);
  } catch (e) {
    reply = errorReplyFor(req, e);
  }
  return { ...reply, routeId: req.routeId, sessionId: reply.sessionId, seq: req.seq, flags: reply.flags | FrameFlag.Reply };
}

/**
 * The order a serving side answers requests in: one lane per session, so a session's frames
 * never overtake each other while different sessions' run side by side (the stage's compute
 * queue then schedules them fairly). A close or status request, and any frame of no session,
 * runs at once: cancelling must not wait behind the work it cancels.
 */
export class FrameLanes {
  private readonly lanes = new Map<string, Promise<void>>();

  run(req: Frame, task: () => Promise<void>): void {
    const immediate = req.type === FrameType.SessionClose || req.type === FrameType.Status || req.sessionId === NIL_SESSION;
    if (immediate) return void task().catch(() => undefined);
    const key = req.sessionId;
    const next = (this.lanes.get(key) ?? Promise.resolve()).then(task).catch(() => undefined);
    this.lanes.set(key, next);
    void next.then(() => {
      if (this.lanes.get(key) === next) this.lanes.delete(key);
    });
  }

  /** sessions with frames still in their lane */
  get busy(): number {
    return this.lanes.size;
  }
}

/** Pending requests keyed by sequence number. */
export class PendingReplies {
  private nextSeq = 1;
  private waiting = new Map<number, { resolve: (f: Frame) => void; reject: (e: Error) => void }>();

  take(): { seq: number; reply: Promise<Frame> } {
    const seq = this.nextSeq;
    this.nextSeq = (this.nextSeq + 1) >>> 0 || 1;
    const reply = new Promise<Frame>((resolve, reject) => this.waiting.set(seq, { resolve, reject }));
    return { seq, reply };
  }

  /** Delivers a reply; false when nobody waits for its sequence number. */
  deliver(frame: Frame): boolean {
    const w = this.waiting.get(frame.seq);
    if (!w) return false;
    this.waiting.delete(frame.seq);
    if (frame.type === FrameType.Error) w.reject(errorFromFrame(frame));
    else w.resolve(frame);
    return true;
  }

  fail(seq: number, e: Error): void {
    const w = this.waiting.get(seq);
    if (!w) return;
    this.waiting.delete(seq);
    w.reject(e);
  }

  failAll(e: Error): void {
    for (const w of this.waiting.values()) w.reject(e);
    this.waiting.clear();
  }

  get size(): number {
    return this.waiting.size;
  }
}

/** A link to a handler in the same process (single-process routes, tests, the bench baseline). */
export class LocalLink implements FrameLink {
  readonly remote = 'local';
  onClose?: (reason: MeshError) => void;
  private closed = false;
  constructor(private readonly handler: FrameHandler) {}

  async request(frame: Frame): Promise<Frame> {
    if (this.closed) throw new MeshError('LINK_CLOSED', 'local link is closed');
    return unwrapReply(await answer(this.handler, frame));
  }

  async close(): Promise<void> {
    this.closed = true;
  }
}
