// A client of a room: waits for the room's route to be ready, connects to the signaling server
// over WebSocket, and offers the route as a StageChain, so the same generation loop that runs
// local stages runs a distributed route (`generate --join`).

import { MeshError } from '../errors.ts';
import { headerFromWire } from '../protocol/header-wire.ts';
import type { GgufHeader } from '../gguf/types.ts';
import { WsLink } from '../transport/ws.ts';
import { fetchJson } from '../transport/server-json.ts';
import { RouteSessionClient } from './client.ts';
import { parseJoinUrl } from '../protocol/control.ts';
import type { ModelBrief } from '../protocol/control.ts';
import type { StageChain } from './generation.ts';
import { newSessionId } from '../protocol/session.ts';
import type { SessionInfo } from './sessions.ts';
import type { StageTiming, TelemetryEvent } from './telemetry.ts';
import { ResumingLink } from './resuming-link.ts';
import type { RoomConnection } from './resuming-link.ts';
import type { SessionOpenBody } from '../protocol/session.ts';

export interface RoomSummary {
  id: string;
  model: ModelBrief;
  peers: number;
  route: { id: number; status: string; reason: string | null } | null;
}

export interface JoinedRoom {
  base: string;
  roomId: string;
  secret: string;
  /** the room as it was when joined */
  room: RoomSummary;
  /** the room's ready route now: after a resume, the one the link's sessions continue on */
  readonly routeId: number;
  /** frames to the room; a session opened through it outlives the instance it went through (resuming-link.ts) */
  link: ResumingLink;
  /** reads the model's header through the server (tokenizer, config) */
  header(): Promise<GgufHeader>;
  close(): Promise<void>;
}

export interface JoinOptions {
  /**
   * how long a session whose link to the server dropped (the instance died, a restart) waits for
   * the room's ready route to continue on, reached through the same join URL (ms; default: the
   * join's waitMs; 0: no resume — the lost link's error is the caller's)
   */
  resumeMs?: number;
  /** the link's telemetry (session_resumed) */
  onEvent?: (e: TelemetryEvent) => void;
}

interface RoomTarget {
  base: string;
  roomId: string;
  key: string;
}

/** Waits (up to `waitMs`) for the room's route to be ready, then connects. */
export async function joinRoom(joinUrl: string, secret: string | undefined, waitMs = 30_000, options: JoinOptions = {}): Promise<JoinedRoom> {
  const parsed = parseJoinUrl(joinUrl);
  const key = secret ?? parsed.secret;
  if (!key) throw new MeshError('AUTH_FAILED', 'no room secret: pass --secret or a join URL with #secret=…');
  const target: RoomTarget = { base: parsed.base, roomId: parsed.roomId, key };
  const first = await connectRoom(target, Date.now() + waitMs, waitMs, false);
  const resumeMs = options.resumeMs ?? waitMs;
  const link = new ResumingLink(first, { waitMs: resumeMs, rejoin: (deadline) => connectRoom(target, deadline, resumeMs, true), ...(options.onEvent ? { onEvent: options.onEvent } : {}) });
  return {
    base: parsed.base,
    roomId: parsed.roomId,
    secret: key,
    room: first.room,
    get routeId() {
      return link.routeId;
    },
    link,
    // the header as JSON from the server: an API key may not read model bytes (only peers may)
    header: async () => headerFromWire(await fetchJson<unknown>(`${parsed.base}/v1/models/${encodeURIComponent(first.room.model.id)}/header`, key)),
    close: () => link.close(),
  };
}

/**
 * Waits until `deadline` for the room's route to be ready, then opens a frame socket to the
 * room. `patient` (a resume): a server that does not answer, refuses for now (the room passing
 * to another instance) or drops the socket is asked again until then, every request bounded by
 * the time left; only a refused secret ends it early. Otherwise only a route not ready yet is
 * waited for.
 */
async function connectRoom(t: RoomTarget, deadline: number, waitMs: number, patient: boolean): Promise<RoomConnection & { room: RoomSummary }> {
  let last = '';
  for (;;) {
    const left = (): number => Math.max(1, deadline - Date.now());
    try {
      const room = await fetchJson<RoomSummary>(`${t.base}/v1/rooms/${t.roomId}`, t.key, patient ? { timeoutMs: left() } : {});
      const r = room.route;
      if (r?.status === 'ready') {
        const link = await WsLink.connect(`${t.base.replace(/^http/, 'ws')}/v1/rooms/${t.roomId}/client`, { headers: { authorization: `Bearer ${t.key}` }, ...(patient ? { connectTimeoutMs: Math.min(10_000, left()) } : {}) });
        return { room, routeId: r.id, link };
      }
      last = `route is ${r ? `${r.status}${r.reason ? ` (${r.reason})` : ''}` : 'not planned yet'}`;
    } catch (e) {
      if (!patient || (e instanceof MeshError && e.code === 'AUTH_FAILED')) throw e;
      last = (e as Error).message;
    }
    if (Date.now() > deadline) throw new MeshError('ROUTE_NOT_READY', `room ${t.roomId}: ${patient ? `no ready route through ${t.base} within ${waitMs} ms (last: ${last})` : `${last} after ${waitMs} ms`}`);
    await new Promise((r) => setTimeout(r, Math.min(200, left())));
  }
}

/** The room's route as a StageChain: logits come back from the last stage. */
export class RemoteChain implements StageChain {
  private sessions = new Map<string, RouteSessionClient>();
  /** wire session ids (32 hex digits) by the caller's ids */
  readonly wireIds = new Map<string, string>();
  /** the last released session's status, read just before it closed (per-stage timings) */
  lastInfo: SessionInfo | null = null;

  constructor(
    private readonly joined: JoinedRoom,
    private readonly openBody: Omit<SessionOpenBody, 'contextLength'> = {},
  ) {}

  async openSession(sessionId: string, contextLength: number): Promise<void> {
    const wire = /^[0-9a-f]{32}$/.test(sessionId) ? sessionId : newSessionId();
    const client = await RouteSessionClient.open(this.joined.link, this.joined.routeId, { ...this.openBody, contextLength }, wire);
    this.sessions.set(sessionId, client);
    this.wireIds.set(sessionId, wire);
  }

  async forward(sessionId: string, tokens: Int32Array, position: number): Promise<Float32Array> {
    const c = this.client(sessionId);
    if (position !== c.position) throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${c.position}, asked to run position ${position}`);
    return c.logits(tokens);
  }

  async releaseSession(sessionId: string): Promise<void> {
    const c = this.client(sessionId);
    this.sessions.delete(sessionId);
    this.lastInfo = await c.info().catch(() => null);
    await c.close();
  }

  async dispose(): Promise<void> {
    for (const id of [...this.sessions.keys()]) await this.releaseSession(id).catch(() => undefined);
    await this.joined.close();
  }

  private client(id: string): RouteSessionClient {
    const c = this.sessions.get(id);
    if (!c) throw new MeshError('SESSION_UNKNOWN', `no session ${id} on this chain`);
    return c;
  }
}

/** A per-stage timing table (text) from a session's status. */
export function timingTable(info: SessionInfo): string {
  const rows = info.stages.map((s) => ({ shard: s.shard as { start: number; end: number } | undefined, peer: String(s.peer ?? ''), t: s.timing as StageTiming | undefined }));
  const lines = ['stage  layers   peer                 steps  compute ms  downstream ms  overhead ms   bytes in  bytes out'];
  for (const r of rows) {
    if (!r.t) continue;
    const layers = r.shard ? `${r.shard.start}-${r.shard.end}` : '?';
    lines.push(
      `${String(r.t.stage).padStart(5)}  ${layers.padEnd(7)}  ${r.peer.slice(0, 20).padEnd(20)} ${String(r.t.steps).padStart(5)}  ${r.t.computeMs.toFixed(1).padStart(10)}  ${r.t.downstreamMs.toFixed(1).padStart(13)}  ${r.t.overheadMs.toFixed(1).padStart(11)}  ${String(r.t.bytesIn).padStart(9)}  ${String(r.t.bytesOut).padStart(9)}`,
    );
  }
  return lines.join('\n');
}
