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
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { networkInterfaces } from 'node:os';
import { WebSocketServer } from 'ws';
import type WebSocket from 'ws';
import type { IceServer } from '../src/protocol/control.ts';
import { isTerminal } from '../src/route/session-state.ts';
import type { SessionManager } from '../src/route/sessions.ts';
import { refuseUpgrade } from '../src/transport/frame-server.ts';
import { serveFrames } from '../src/transport/ws.ts';
import { MeshError } from '../src/errors.ts';
import { Cluster } from './cluster.ts';
import { HttpApi } from './http-api.ts';
import { linkUpgrade, RoomLinks } from './instance-link.ts';
import type { AppHook } from './http-api.ts';
import type { FetchLog } from './model-host.ts';
import { admitPeer, DEFAULT_LIVENESS } from './peer-admission.ts';
import type { Room } from './room.ts';
import { RoomRegistry } from './room-registry.ts';
import { startStunResponder } from './stun.ts';
import type { StunResponder } from './stun.ts';
import type { RoomRegistryOptions } from './room-registry.ts';
import type { Access, CredentialOptions, Grant } from './access.ts';
import type { StagePolicy } from './stage-policy.ts';
import type { ServerTls } from './tls.ts';

/** what the server passes to its rooms as they are (room-registry.ts says what each means) */
type RoomSettings = Pick<RoomRegistryOptions, 'repairTimeoutMs' | 'standby' | 'planner' | 'replanGain' | 'stagePolicy' | 'linkProbeMs' | 'heartbeatMs' | 'heartbeatTimeoutMs' | 'stepTimeoutMs' | 'speculate' | 'turn'>;

export interface SignalingServerOptions extends CredentialOptions, RoomSettings {
  host?: string;
  port?: number;
  /** model paths or URLs, one room each */
  models: string[];
  /** one secret for every room: the join secret (default: a random one per model, kept under the cache dir) */
  secret?: string;
  /** the session manager's and the OpenAI API's limits */
  limits?: RoomRegistryOptions['limits'];
  /** public rooms: trusted peers serve the first and last stages, a fraction of sessions is re-run on them */
  publicRoom?: RoomRegistryOptions['publicRoom'];
  /** a route is planned once this many peers joined (default 1) */
  minPeers?: number;
  /** wait this long after the last join before planning (ms, default 300) */
  planDelayMs?: number;
  /** idle sessions expire after this long (ms, default 5 min) */
  sessionTtlMs?: number;
  /** STUN/TURN servers announced to every peer in welcome */
  iceServers?: IceServer[];
  /** answer STUN on UDP at the server's own address and port number (./stun.ts), announced first in welcome */
  stun?: boolean;
  log?: (line: string) => void;
  /** HTTPS and WSS on the same port with this certificate (./tls.ts); absent: plain HTTP */
  tls?: ServerTls;
  /**
   * Answers requests before the API (the web app): resolves true when it answered, false to leave
   * the request to the API. Never sees WebSocket upgrades.
   */
  app?: AppHook;
  /** run as one instance of a cluster sharing this Redis (./cluster.ts); needs `secret` */
  cluster?: { redisUrl: string; /** how the other instances reach this one (default: this server's URL) */ url?: string; leaseMs?: number; prefix?: string };
}

export interface SignalingServer {
  url: string;
  rooms: Room[];
  sessions: SessionManager;
  /** who may do what: the credentials (access.ts) */
  access: Access;
  fetchLogs: Map<string, FetchLog>;
  /** the page, with the admin secret in the fragment (it lists the rooms' join links) */
  pageUrl: string;
  /** the join URL of a room, secret in the fragment */
  joinUrl(room: Room): string;
  /** opens one more room on this server for a model path or URL (same rules as `models`) */
  addRoom(location: string): Promise<Room>;
  /** this instance's part in a cluster (serve --redis), null alone */
  cluster: Cluster | null;
  close(): Promise<void>;
}

/** A client sends small frames (token ids, JSON bodies): what it may hold in reassembly is small too. */
const CLIENT_REASSEMBLY = { maxPendingBytes: 4 * 1024 * 1024, maxAgeMs: 30_000 };

/** This machine's first non-loopback IPv4 address, if it has one. */
function lanAddress(): string | undefined {
  return Object.values(networkInterfaces())
    .flat()
    .find((a) => a && a.family === 'IPv4' && !a.internal)?.address;
}

/** A client's frame socket: its sessions are its own, cancelled when it drops. */
function serveClient(registry: RoomRegistry, room: Room, ws: WebSocket, grant: Grant): void {
  const scoped: Grant = { ...grant, rooms: [room] };
  serveFrames(
    ws,
    async (f) => {
      registry.checkFrame(f, scoped);
      return registry.sessions.handle(f, ws, grant.principal);
    },
    { reassembly: CLIENT_REASSEMBLY },
  );
  ws.on('close', () => void registry.sessions.ownerGone(ws));
}

/**
 * The rooms' side of the cluster: a room whose lease passed on is handed off (its peers rejoin
 * through any instance, to the new holder), a held room publishes its route under its lease,
 * and each session opened here is recorded as this instance's.
 */
async function joinRooms(cluster: Cluster, registry: RoomRegistry, linked: RoomLinks): Promise<void> {
  const byId = (id: string): Room | undefined => registry.rooms.find((r) => r.id === id);
  cluster.onLost = (id, why) => byId(id)?.handOff(why);
  cluster.movable = (id) => {
    const room = byId(id);
    return !!room && room.peers.size === 0 && !registry.sessions.list().some((s) => registry.findRoute(s.routeId)?.room === room && !isTerminal(s.state));
  };
  cluster.onGained = (id) => {
    // sockets and requests passed on to the room's last holder (dead, or stale and frozen) end: their peers rejoin here
    linked.endAll(id);
    const room = byId(id);
    if (room) void cluster.publish(id, roomState(room));
  };
  for (const room of registry.rooms) {
    room.subscribe((e) => {
      if (e.type.startsWith('route_')) void cluster.publish(room.id, roomState(room));
    });
  }
  registry.sessions.onOpened = (sessionId, routeId) => {
    const room = registry.findRoute(routeId)?.room;
    if (room) void cluster.claimSession(sessionId, room.id, 60 * 60_000);
  };
  await cluster.start();
}

/** What a holder publishes of its room: the route and who serves which layers. */
function roomState(room: Room): Record<string, unknown> {
  const r = room.route;
  return { roomId: room.id, route: r ? { id: r.id, status: r.status, stages: r.stages.map((s) => ({ stage: s.stage, peerId: s.peerId, start: s.shard.start, end: s.shard.end })) } : null, peers: room.peers.size, at: Date.now() };
}

export async function startSignalingServer(opts: SignalingServerOptions): Promise<SignalingServer> {
  const log = opts.log ?? (() => undefined);
  // before anything binds: a refused start holds no port
  if (opts.cluster && !opts.secret) throw new MeshError('CLUSTER_NEEDS_SECRET', 'serve --redis needs --secret: every instance must open the same rooms (their ids come from the secret)');
  const server = opts.tls ? createHttpsServer({ cert: opts.tls.cert, key: opts.tls.key }) : createServer();
  const wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 * 1024 });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 8080, opts.host ?? '127.0.0.1', () => resolve());
  });
  const addr = server.address() as AddressInfo;
  // bound to every interface: links name one address other devices can use, not 0.0.0.0
  const wildcard = addr.address === '0.0.0.0' || addr.address === '::';
  const shown = wildcard ? (lanAddress() ?? '127.0.0.1') : addr.address;
  const url = `${opts.tls ? 'https' : 'http'}://${shown.includes(':') ? `[${shown}]` : shown}:${addr.port}`;
  let stun: StunResponder | null = null;
  if (opts.stun) {
    try {
      stun = await startStunResponder(addr.address, addr.port, shown, log);
    } catch (e) {
      server.close();
      throw e;
    }
  }
  // on a wildcard bind the join link names one of several addresses: each peer is told the STUN
  // server at the address its own connection reached (a phone on the Wi-Fi is not told a VPN's)
  const stunAt = stun ? (reachedAt: string | undefined): IceServer => (wildcard && reachedAt ? stun!.iceServerAt(reachedAt) : stun!.iceServer) : undefined;
  let cluster: Cluster | null = null;
  if (opts.cluster) {
    // (opts.secret: checked before the port was bound)
    try {
      cluster = await Cluster.join({ ...opts.cluster, url: opts.cluster.url ?? url, secret: opts.secret!, log }, () => registry.rooms.map((r) => r.id));
    } catch (e) {
      await stun?.close();
      server.close();
      throw e;
    }
  }
  // what this instance passed on to another, by room (ended when the room comes here)
  const linked = new RoomLinks();
  // the rooms are made once the address is known: their model URLs name it
  const registry = new RoomRegistry(url, { ...opts, ...(stunAt ? { stunAt } : {}), log, ...(cluster ? { routeIdBase: cluster.routeIdBase } : {}) });
  server.on('request', new HttpApi(registry, { ...(opts.app ? { app: opts.app } : {}), tls: opts.tls ?? null, url, cluster, linked }).handle);
  const trust = opts.tls?.ca ? { ca: opts.tls.ca.pem } : {};

  server.on('upgrade', (req, socket, head) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    const m = /^\/v1\/rooms\/([^/]+)\/(peer|client)$/.exec(path);
    const room = m ? registry.rooms.find((r) => r.id === m[1]) : undefined;
    if (!m || !room) {
      refuseUpgrade(socket, 'NOT_FOUND');
      return;
    }
    if (cluster) {
      // another instance holds the room: the socket goes on to it (a link from an instance is never passed on again)
      const c = cluster;
      void (async () => {
        try {
          const viaLink = c.fromInstance(req);
          const holder = viaLink ? (c.holds(room.id) ? null : Promise.reject(new MeshError('ROOM_ELSEWHERE', `room ${room.id} is not held here`))) : c.holderOf(room.id);
          const target = await holder;
          if (target) return linkUpgrade(wss, req, socket, head, target, c.linkProof(), trust, (peer) => peer.once('close', linked.add(room.id, () => peer.close(1012, 'the room moved to this instance'))));
          accept(req, socket, head, m[2] as 'peer' | 'client', room);
        } catch (e) {
          refuseUpgrade(socket, e instanceof MeshError ? e.code : 'INTERNAL');
        }
      })();
      return;
    }
    accept(req, socket, head, m[2] as 'peer' | 'client', room);
  });

  /** A peer or client socket for a room this server hosts. */
  function accept(req: IncomingMessage, socket: Duplex, head: Buffer, kind: 'peer' | 'client', room: Room): void {
    let grant: Grant | null = null;
    if (kind === 'client') {
      // a client socket runs sessions: an API key or the admin secret, for this room
      try {
        grant = registry.access.grantOf(req);
      } catch {
        return refuseUpgrade(socket, 'AUTH_FAILED');
      }
      if (!grant.rooms.includes(room)) return refuseUpgrade(socket, 'AUTH_FAILED');
      if (!grant.roles.has('api') && !grant.roles.has('admin')) return refuseUpgrade(socket, 'FORBIDDEN');
    }
    // the origin this peer reached us at (its Host header, when it is a plain host[:port])
    const host = /^[A-Za-z0-9.:[\]-]+$/.test(req.headers.host ?? '') ? req.headers.host : null;
    const origin = host ? `${opts.tls ? 'https' : 'http'}://${host}` : undefined;
    // the address of this machine the connection reached (an IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d)
    const reachedAt = req.socket.localAddress?.replace(/^::ffff:(?=\d+\.)/, '');
    const liveness = { heartbeatMs: opts.heartbeatMs ?? DEFAULT_LIVENESS.heartbeatMs, heartbeatTimeoutMs: opts.heartbeatTimeoutMs ?? DEFAULT_LIVENESS.heartbeatTimeoutMs };
    wss.handleUpgrade(req, socket, head, (ws) => (grant ? serveClient(registry, room, ws, grant) : admitPeer(room, ws, registry.relayLedger(room), { ...(origin ? { origin } : {}), ...(reachedAt ? { reachedAt } : {}) }, liveness)));
  }
  /** Everything this server opened, closed: its rooms and their peers, the cluster's links, STUN and the port. */
  const shutdown = async (): Promise<void> => {
    await cluster?.close();
    await registry.dispose();
    await stun?.close();
    wss.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  // a model it cannot serve ends the server: nothing keeps the port for rooms that never open
  try {
    for (const location of opts.models) await registry.addRoom(location);
    if (cluster) await joinRooms(cluster, registry, linked);
  } catch (e) {
    await shutdown();
    throw e;
  }

  return {
    url,
    rooms: registry.rooms,
    sessions: registry.sessions,
    access: registry.access,
    fetchLogs: registry.fetchLogs,
    pageUrl: `${url}/#admin=${encodeURIComponent(registry.access.adminSecret)}`,
    // a local CA's fingerprint rides in the fragment too: native nodes pin it (src/transport/tls-trust.ts)
    joinUrl: (room) => `${url}/room/${room.id}#secret=${encodeURIComponent(room.secret)}${opts.tls?.ca ? `&ca=${opts.tls.ca.fingerprint}` : ''}`,
    addRoom: (location) => registry.addRoom(location),
    cluster,
    close: shutdown,
  };
}
