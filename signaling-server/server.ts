// The signaling server: hosts model files (Range), keeps a room per model, admits peers that
// prove the room secret, plans routes over them, owns every session (open, step, close,
// expiry, failure), and answers the status API. Hidden states never pass through it: stages
// send them to each other directly. This file wires the units together: room-registry.ts (rooms,
// hosted files, sessions, which rooms a secret opens), http-api.ts (the HTTP router),
// peer-admission.ts (a peer socket's challenge and hello), serveClient (a client's frames).
//
//   GET|HEAD /models/{model}.gguf            model bytes (Range)           Bearer secret
//   GET  /v1/models/{model}/fetches          byte ranges each client read  Bearer secret
//   GET  /v1/rooms/{room}                    room summary                  Bearer secret
//   GET  /v1/rooms/{room}/peers              peers, backends, stages       Bearer secret
//   GET  /v1/routes, /v1/routes/{id}         route status and stages       Bearer secret
//   GET  /v1/sessions/{id}                   session state, per-stage KV   Bearer secret
//   POST /v1/sessions/{id}[/prefill|/decode], DELETE /v1/sessions/{id}     binary frames
//   WS   /v1/rooms/{room}/peer               peer control (challenge → hello with HMAC proof)
//   WS   /v1/rooms/{room}/client             client frames (Bearer secret on the upgrade)
//   GET  /v1/sessions/{id}/events            session telemetry as Server-Sent Events
//   GET  /v1/rooms/{room}/events             route telemetry (planned, loading, ready, status) as SSE
//   POST /v1/chat/completions, /v1/completions; GET /v1/models   OpenAI-compatible (./openai.ts)
//   GET  /tls/ca.json, /tls/ca.crt, /tls/ca.pem   the local CA devices trust (./tls.ts)   public

import { createServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { networkInterfaces } from 'node:os';
import { WebSocketServer } from 'ws';
import type WebSocket from 'ws';
import type { IceServer } from '../src/protocol/control.ts';
import type { SessionManager } from '../src/route/sessions.ts';
import { bearerOf, refuseUpgrade, secretMatches } from '../src/transport/frame-server.ts';
import { serveFrames } from '../src/transport/ws.ts';
import { HttpApi } from './http-api.ts';
import type { AppHook } from './http-api.ts';
import type { FetchLog } from './model-host.ts';
import { admitPeer, DEFAULT_LIVENESS } from './peer-admission.ts';
import type { Room } from './room.ts';
import { RoomRegistry } from './room-registry.ts';
import type { StagePolicy } from './stage-policy.ts';
import type { ServerTls } from './tls.ts';

export interface SignalingServerOptions {
  host?: string;
  port?: number;
  /** model paths or URLs, one room each */
  models: string[];
  /** one secret for every room (default: a random one per room) */
  secret?: string;
  /** a route is planned once this many peers joined (default 1) */
  minPeers?: number;
  /** wait this long after the last join before planning (ms, default 300) */
  planDelayMs?: number;
  /** idle sessions expire after this long (ms, default 5 min) */
  sessionTtlMs?: number;
  /** STUN/TURN servers announced to every peer in welcome */
  iceServers?: IceServer[];
  /** a route that loses a stage waits this long for a replacement (ms, default 30 s; 0 = no repair: sessions fail at once) */
  repairTimeoutMs?: number;
  /** spares load their standby shard ahead of time (default true) */
  standby?: boolean;
  /** 'memory' (default): in proportion to memory; 'speed': the planner that knows speed and round trips, where every peer reports a speed */
  planner?: 'speed' | 'memory';
  /** who may be a stage: a minimum stay and memory (stage-policy.ts; default: anyone, at once) */
  stagePolicy?: StagePolicy;
  /** a WebSocket ping to every peer this often (ms, default 0.5 s) */
  heartbeatMs?: number;
  /** a peer silent this long is lost (ms, default 3.5 s) */
  heartbeatTimeoutMs?: number;
  /** a step unanswered this long makes the server probe the route's stages for a stalled one (ms, default 30 s) */
  stepTimeoutMs?: number;
  /** mint each peer a short-lived credential for the TURN servers in `iceServers` that name none (./turn.ts) */
  turn?: { secret: string; ttlS: number };
  log?: (line: string) => void;
  /** HTTPS and WSS on the same port with this certificate (./tls.ts); absent: plain HTTP */
  tls?: ServerTls;
  /**
   * Answers requests before the API (the web app): resolves true when it answered, false to leave
   * the request to the API. Never sees WebSocket upgrades.
   */
  app?: AppHook;
}

export interface SignalingServer {
  url: string;
  rooms: Room[];
  sessions: SessionManager;
  fetchLogs: Map<string, FetchLog>;
  /** the join URL of a room, secret in the fragment */
  joinUrl(room: Room): string;
  /** opens one more room on this server for a model path or URL (same rules as `models`) */
  addRoom(location: string): Promise<Room>;
  close(): Promise<void>;
}

/** This machine's first non-loopback IPv4 address, if it has one. */
function lanAddress(): string | undefined {
  return Object.values(networkInterfaces())
    .flat()
    .find((a) => a && a.family === 'IPv4' && !a.internal)?.address;
}

/** A client's frame socket: its sessions are its own, cancelled when it drops. */
function serveClient(registry: RoomRegistry, room: Room, ws: WebSocket): void {
  serveFrames(ws, async (f) => {
    registry.checkFrameRoom(f, [room]);
    return registry.sessions.handle(f, ws);
  });
  ws.on('close', () => void registry.sessions.ownerGone(ws));
}

export async function startSignalingServer(opts: SignalingServerOptions): Promise<SignalingServer> {
  const log = opts.log ?? (() => undefined);
  const server = opts.tls ? createHttpsServer({ cert: opts.tls.cert, key: opts.tls.key }) : createServer();
  const wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 * 1024 });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 8080, opts.host ?? '127.0.0.1', () => resolve());
  });
  const addr = server.address() as AddressInfo;
  // bound to every interface: links name one address other devices can use, not 0.0.0.0
  const shown = addr.address === '0.0.0.0' || addr.address === '::' ? (lanAddress() ?? '127.0.0.1') : addr.address;
  const url = `${opts.tls ? 'https' : 'http'}://${shown.includes(':') ? `[${shown}]` : shown}:${addr.port}`;
  // the rooms are made once the address is known: their model URLs name it
  const registry = new RoomRegistry(url, { ...opts, log });
  server.on('request', new HttpApi(registry, { ...(opts.app ? { app: opts.app } : {}), tls: opts.tls ?? null, url }).handle);

  server.on('upgrade', (req, socket, head) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    const m = /^\/v1\/rooms\/([^/]+)\/(peer|client)$/.exec(path);
    const room = m ? registry.rooms.find((r) => r.id === m[1]) : undefined;
    if (!m || !room) {
      refuseUpgrade(socket, 'NOT_FOUND');
      return;
    }
    if (m[2] === 'client' && !secretMatches(bearerOf(req), room.secret)) {
      refuseUpgrade(socket, 'AUTH_FAILED');
      return;
    }
    // the origin this peer reached us at (its Host header, when it is a plain host[:port])
    const host = /^[A-Za-z0-9.:[\]-]+$/.test(req.headers.host ?? '') ? req.headers.host : null;
    const origin = host ? `${opts.tls ? 'https' : 'http'}://${host}` : undefined;
    wss.handleUpgrade(req, socket, head, (ws) => (m[2] === 'peer' ? admitPeer(room, ws, registry.relayLedger(room), origin, { heartbeatMs: opts.heartbeatMs ?? DEFAULT_LIVENESS.heartbeatMs, heartbeatTimeoutMs: opts.heartbeatTimeoutMs ?? DEFAULT_LIVENESS.heartbeatTimeoutMs }) : serveClient(registry, room, ws)));
  });
  try {
    for (const location of opts.models) await registry.addRoom(location);
  } catch (e) {
    // a model serve refuses must not leave the port listening
    wss.close();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    throw e;
  }

  return {
    url,
    rooms: registry.rooms,
    sessions: registry.sessions,
    fetchLogs: registry.fetchLogs,
    // a local CA's fingerprint rides in the fragment too: native nodes pin it (src/transport/tls-trust.ts)
    joinUrl: (room) => `${url}/room/${room.id}#secret=${encodeURIComponent(room.secret)}${opts.tls?.ca ? `&ca=${opts.tls.ca.fingerprint}` : ''}`,
    addRoom: (location) => registry.addRoom(location),
    async close() {
      await registry.dispose();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
