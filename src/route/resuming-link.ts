// A client's frame link to a room that outlives the instance it goes through (serve --redis:
// several instances behind one balancer; or one server restarted). When the socket drops —
// not when the server refuses a frame — the next request connects to the room again through
// the join URL, waits (bounded) for the room's ready route, opens each session it had opened
// again on that route and replays its history (session-record.ts), then sends the request:
// the caller's step answers what it would have without the loss, under the ids the caller
// knows (frames and replies are readdressed here). Sessions resume lazily, each on its next
// request; a session this link did not open, or a close or status request, is not resumed.

import { MeshError } from '../errors.ts';
import { FrameType, makeFrame, NIL_SESSION } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { newSessionId } from '../protocol/session.ts';
import type { FrameLink } from '../transport/link.ts';
import type { WsLink } from '../transport/ws.ts';
import { SessionRecord } from './session-record.ts';
import type { TelemetryEvent } from './telemetry.ts';

/** A connection to the room: a frame socket to an instance, and the room's ready route. */
export interface RoomConnection {
  link: WsLink;
  routeId: number;
}

export interface ResumeOptions {
  /** how long a resume waits for the room's route, from the moment the loss is noticed (ms); 0: no resume, a lost link's error is the caller's */
  waitMs: number;
  /** the room again through the join URL, once its route is ready; rejects once `deadline` (ms since the epoch) passed */
  rejoin: (deadline: number) => Promise<RoomConnection>;
  /** session_resumed events */
  onEvent?: (e: TelemetryEvent) => void;
}

/** Codes a request fails with when its carrier went away (checked against the socket's state: a reply naming them is the server's). */
const LOSS_CODES = new Set(['LINK_CLOSED', 'LINK_FAILED']);

interface Tracked {
  rec: SessionRecord;
  /** the connection (its number) the session is open on */
  epoch: number;
  reopening: Promise<void> | null;
}

export class ResumingLink implements FrameLink {
  readonly ordered = true;
  private conn: RoomConnection;
  /** connections made after the first */
  private epoch = 0;
  private rejoining: Promise<void> | null = null;
  /** sessions opened through this link, by the caller's session id */
  private readonly sessions = new Map<string, Tracked>();
  /** route ids of earlier connections: a frame naming one goes to the current route */
  private readonly pastRoutes = new Set<number>();
  private droppedAt: number | null = null;
  /** when the connection the last rejoin replaced was lost (a resume's time counts from it) */
  private lostAt = 0;
  private lastLoss: MeshError | null = null;
  private closed = false;

  constructor(
    first: RoomConnection,
    private readonly opts: ResumeOptions,
  ) {
    this.conn = first;
    this.watch(first);
  }

  get remote(): string {
    return this.conn.link.remote;
  }

  /** the room's route the link's sessions run on now */
  get routeId(): number {
    return this.conn.routeId;
  }

  /** the id the server knows the caller's session `sessionId` by now (its own until a resume): for the HTTP API's /v1/sessions/{id} */
  wireIdOf(sessionId: string): string {
    return this.sessions.get(sessionId)?.rec.wire.sessionId ?? sessionId;
  }

  async request(frame: Frame): Promise<Frame> {
    if (this.opts.waitMs <= 0) return this.conn.link.request(frame);
    const tracked = this.track(frame);
    const resume = { deadline: Infinity };
    for (;;) {
      const conn = await this.connection(frame, tracked, resume);
      const out = this.outgoing(frame, tracked, conn);
      try {
        const reply = await conn.link.request(out);
        tracked?.rec.answered(frame, reply);
        if (frame.type === FrameType.SessionClose) this.sessions.delete(frame.sessionId);
        return out === frame ? reply : { ...reply, routeId: frame.routeId, sessionId: frame.sessionId };
      } catch (e) {
        if (!this.lostWith(conn, e)) {
          if (frame.type === FrameType.SessionOpen && tracked && !tracked.rec.opened) this.sessions.delete(frame.sessionId);
          throw e;
        }
        if (!this.resumable(frame, tracked)) throw e;
        resume.deadline = Math.min(resume.deadline, Date.now() + this.opts.waitMs);
      }
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.conn.link.close();
  }

  /** A SessionOpen starts a record of its session (the first one for an id: a second is the server's to refuse). */
  private track(f: Frame): Tracked | null {
    const known = this.sessions.get(f.sessionId);
    if (known || f.type !== FrameType.SessionOpen) return known ?? null;
    let rec: SessionRecord;
    try {
      rec = SessionRecord.fromOpen(f);
    } catch {
      return null; // a body the server will refuse: nothing to resume
    }
    const t: Tracked = { rec, epoch: this.epoch, reopening: null };
    if (this.pastRoutes.has(f.routeId)) t.rec.wire = { ...t.rec.wire, routeId: this.conn.routeId };
    this.sessions.set(f.sessionId, t);
    return t;
  }

  /** Whether a request lost with its carrier goes again once the room is back: a session's close or status goes with the session, a session this link did not open has nothing to resume from. */
  private resumable(f: Frame, t: Tracked | null): boolean {
    if (this.closed) return false;
    if (f.sessionId === NIL_SESSION) return true;
    if (f.type === FrameType.SessionClose || f.type === FrameType.Status) {
      if (f.type === FrameType.SessionClose) this.sessions.delete(f.sessionId);
      return false;
    }
    return t !== null;
  }

  private lostWith(conn: RoomConnection, e: unknown): boolean {
    return e instanceof MeshError && LOSS_CODES.has(e.code) && !conn.link.open;
  }

  /**
   * The connection to send `f` on, its session open there: after a loss, the room joined
   * again and the session reopened (shared by every request waiting on them). Past
   * `resume.deadline` (set at the loss), SESSION_RESUME_FAILED.
   */
  private async connection(f: Frame, t: Tracked | null, resume: { deadline: number }): Promise<RoomConnection> {
    for (;;) {
      if (this.closed) throw new MeshError('LINK_CLOSED', `link to room through ${this.remote} closed`);
      const stale = !this.conn.link.open || (t !== null && t.epoch !== this.epoch);
      if (!stale) return this.conn;
      if (!this.resumable(f, t)) throw this.lastLoss ?? new MeshError('LINK_CLOSED', `connection to ${this.remote} is not open`);
      if (resume.deadline === Infinity) resume.deadline = Date.now() + this.opts.waitMs;
      if (Date.now() > resume.deadline) throw this.gaveUp(t, new MeshError('ROUTE_NOT_READY', `the room was not back within ${this.opts.waitMs} ms`));
      try {
        if (!this.conn.link.open) await (this.rejoining ??= this.rejoin(resume.deadline).finally(() => (this.rejoining = null)));
        if (t && t.epoch !== this.epoch) await (t.reopening ??= this.reopen(t).finally(() => (t.reopening = null)));
      } catch (e) {
        if (this.closed) throw new MeshError('LINK_CLOSED', `link to room through ${this.remote} closed`);
        if (this.lostWith(this.conn, e)) continue; // the new connection went too: once more
        throw e instanceof MeshError && e.code === 'SESSION_RESUME_FAILED' ? e : this.gaveUp(t, e);
      }
    }
  }

  private async rejoin(deadline: number): Promise<void> {
    this.pastRoutes.add(this.conn.routeId);
    this.lostAt = this.droppedAt ?? Date.now();
    const next = await this.opts.rejoin(deadline);
    if (this.closed) {
      await next.link.close();
      throw new MeshError('LINK_CLOSED', 'link closed while the room was joined again');
    }
    this.conn = next;
    this.epoch++;
    this.watch(next);
  }

  /** Opens `t`'s session again on the current route, under a new id, and replays its history (an open not yet answered is sent again by its own request). */
  private async reopen(t: Tracked): Promise<void> {
    const conn = this.conn;
    const { link, routeId } = conn;
    const epoch = this.epoch;
    const wire = { routeId, sessionId: newSessionId() };
    if (!t.rec.opened) {
      t.rec.wire = wire;
      t.epoch = epoch;
      return;
    }
    const from = t.rec.wire;
    const since = this.lostAt;
    const replayFrom = Date.now();
    try {
      await link.request(t.rec.reopenFrame(wire));
      for (const f of t.rec.replayFrames(wire)) await link.request(f);
    } catch (e) {
      if (this.lostWith(conn, e)) throw e;
      await link.request(makeFrame({ type: FrameType.SessionClose, ...wire })).catch(() => undefined);
      throw new MeshError('SESSION_RESUME_FAILED', `session ${t.rec.caller.sessionId}: reopening it on route ${routeId} at position ${t.rec.position} was refused: ${(e as Error).message}`, { cause: (e as MeshError).code });
    }
    t.rec.wire = wire;
    t.epoch = epoch;
    const tokensReplayed = t.rec.history.reduce((n, h) => n + h.tokens.length, 0);
    this.opts.onEvent?.({ type: 'session_resumed', sessionId: t.rec.caller.sessionId, wireSessionId: wire.sessionId, routeId, previousRouteId: from.routeId, position: t.rec.position, tokensReplayed, replayMs: Date.now() - replayFrom, resumeMs: Date.now() - since });
  }

  private gaveUp(t: Tracked | null, e: unknown): MeshError {
    const what = t ? `session ${t.rec.caller.sessionId} (at position ${t.rec.position})` : 'the room link';
    const loss = this.lastLoss ? ` (${this.lastLoss.message})` : '';
    return new MeshError('SESSION_RESUME_FAILED', `${what}: its connection to the room was lost${loss} and could not be resumed: ${(e as Error).message}`, e instanceof MeshError ? { cause: e.code } : undefined);
  }

  /** A frame as it goes out: the session's current address, or the current route for a route this link has left. */
  private outgoing(f: Frame, t: Tracked | null, conn: RoomConnection): Frame {
    const at = t ? t.rec.wire : { routeId: this.pastRoutes.has(f.routeId) ? conn.routeId : f.routeId, sessionId: f.sessionId };
    return at.routeId === f.routeId && at.sessionId === f.sessionId ? f : { ...f, routeId: at.routeId, sessionId: at.sessionId };
  }

  private watch(conn: RoomConnection): void {
    this.droppedAt = null;
    conn.link.onClose = (reason) => {
      this.droppedAt = Date.now();
      this.lastLoss = reason;
    };
  }
}
