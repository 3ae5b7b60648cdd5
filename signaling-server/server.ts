// The signaling server: hosts model files (Range), keeps a room per model, admits peers that
// prove the room secret, plans routes over them, owns every session (open, step, close,
// expiry, failure), and answers the status API. Hidden states never pass through it: stages
// send them to each other directly.
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

import { createServer } from 'node:http';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import { basename } from 'node:path';
import { WebSocketServer } from 'ws';
import type WebSocket from 'ws';
import { MeshError } from '../src/errors.ts';
import { isUrl } from '../src/gguf/parse.ts';
import { artifactFiles, readArtifactHeader, splitName } from '../src/gguf/split.ts';
import { hyperParameters } from '../src/gguf/summary.ts';
import { isServeCapability } from '../src/model/serve-capability.ts';
import { helloProof } from '../src/protocol/control.ts';
import type { IceServer, PeerHello, PeerToServer } from '../src/protocol/control.ts';
import { SessionManager } from '../src/route/sessions.ts';
import { FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { bearerOf, secretMatches } from '../src/transport/frame-server.ts';
import { handleFrameHttp, sendError, sendJson } from '../src/transport/http.ts';
import { serveFrames } from '../src/transport/ws.ts';
import { FetchLog, serveFile } from './model-host.ts';
import { handleOpenAi } from './openai.ts';
import { loadOrBuildManifest } from '../src/gguf/manifest.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import { headerToWire } from '../src/protocol/header-wire.ts';
import { handleBrowserPeerMessage } from './browser-peers.ts';
import type { RelayLedger } from './browser-peers.ts';
import { Room } from './room.ts';
import type { Route } from './room.ts';

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
  log?: (line: string) => void;
  /**
   * Answers requests before the API (the web app): resolves true when it answered, false to leave
   * the request to the API. Never sees WebSocket upgrades.
   */
  app?: (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;
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

/** The file name a location ends in (a URL's path, a local path's base name). */
function fileNameOf(location: string): string {
  return basename(isUrl(location) ? new URL(location).pathname : location);
}

/** A room's model id: the file name without `.gguf` (a split's shared prefix), unique among the rooms. */
function modelIdFor(location: string, taken: Set<string>): string {
  const file = fileNameOf(location);
  const name = (splitName(file)?.prefix ?? file.replace(/\.gguf$/i, '')).replace(/[^A-Za-z0-9_.-]/g, '_') || 'model';
  let id = name;
  for (let i = 2; taken.has(id); i++) id = `${name}-${i}`;
  taken.add(id);
  return id;
}

export async function startSignalingServer(opts: SignalingServerOptions): Promise<SignalingServer> {
  const log = opts.log ?? (() => undefined);
  const rooms: Room[] = [];
  const fetchLogs = new Map<string, FetchLog>();
  // hosted file name (without .gguf) → the local file; a split artifact hosts each part
  const localFiles = new Map<string, { modelId: string; path: string; size: number; file: number }>();
  let routeCounter = 0;
  const manifests = new Map<string, Promise<Manifest>>();
  const relayLedgers = new Map<string, RelayLedger>();
  const findRoute = (id: number): Route | undefined => {
    for (const room of rooms) for (const r of room.routes) if (r.id === id) return r;
    return undefined;
  };
  const sessions = new SessionManager(
    (routeId) => {
      const r = findRoute(routeId);
      return r && r.status === 'ready' ? r : undefined;
    },
    { idleTtlMs: opts.sessionTtlMs ?? 5 * 60_000, onChange: (id, state) => log(`session ${id}: ${state}`) },
  );

  const server: Server = createServer((req, res) => void handle(req, res));
  const wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 * 1024 });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 8080, opts.host ?? '127.0.0.1', () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const url = `http://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`;

  const taken = new Set<string>();
  async function addRoom(location: string): Promise<Room> {
    // a split GGUF (any part named) is one model: the joined header addresses its parts concatenated
    const art = await readArtifactHeader(location);
    const header = art.header;
    // any architecture opens a room: what each peer can serve of it is the planner's question
    const { n_layer: nLayer } = hyperParameters(header, location);
    const id = modelIdFor(location, taken);
    const remote = isUrl(location);
    const split = art.files.length > 1;
    // hosted as /models/{id}.gguf, or /models/{id}-0000k-of-0000n.gguf per part (llama.cpp's names)
    const hostedNames = art.files.map((_, k) => (split ? `${id}-${String(k + 1).padStart(5, '0')}-of-${String(art.files.length).padStart(5, '0')}` : id));
    if (!remote) {
      art.files.forEach((f, k) => localFiles.set(hostedNames[k]!, { modelId: id, path: f.location, size: f.header.fileBytes, file: k }));
      fetchLogs.set(id, new FetchLog());
    }
    const room = new Room(
      randomBytes(6).toString('hex'),
      opts.secret ?? randomBytes(18).toString('base64url'),
      { id, location, header, nLayer, files: art.files.length },
      {
        minPeers: opts.minPeers ?? 1,
        planDelayMs: opts.planDelayMs ?? 300,
        // peers read the first part's URL; the other parts' URLs follow from its name
        modelUrl: remote ? artifactFiles(location)[0]! : `${url}/models/${hostedNames[0]}.gguf`,
        nextRouteId: () => ++routeCounter,
        sessions,
        log,
        ...(opts.iceServers?.length ? { iceServers: opts.iceServers } : {}),
      },
    );
    rooms.push(room);
    // the manifest (computed once, cached beside a local file) names the artifact peers advertise
    const manifest = loadOrBuildManifest(location);
    manifests.set(id, manifest);
    manifest.then(
      (m) => {
        room.artifactSha = m.artifact.sha256;
        log(`[room ${room.id}] artifact sha256 ${m.artifact.sha256}`);
      },
      (e) => log(`[room ${room.id}] manifest failed: ${(e as Error).message}`),
    );
    return room;
  }
  for (const location of opts.models) await addRoom(location);

  /** Rooms whose secret the request presents. */
  const authed = (req: IncomingMessage): Room[] => {
    const token = bearerOf(req);
    return rooms.filter((r) => secretMatches(token, r.secret));
  };
  const requireAuth = (req: IncomingMessage): Room[] => {
    const ok = authed(req);
    if (ok.length === 0) throw new MeshError('AUTH_FAILED', 'missing or wrong room secret (Authorization: Bearer <secret>)');
    return ok;
  };
  /** The room a session frame belongs to, checked against the request's secret. */
  const roomOfFrame = (f: Frame, allowed: Room[]): void => {
    const routeId = f.type === FrameType.SessionOpen ? f.routeId : sessions.brief(f.sessionId).routeId;
    const r = findRoute(routeId);
    if (!r) throw new MeshError('ROUTE_UNKNOWN', `no route ${routeId}`);
    if (!allowed.includes(r.room)) throw new MeshError('AUTH_FAILED', `the secret does not open route ${routeId}'s room`);
  };

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      if (opts.app && (await opts.app(req, res))) return;
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      const method = req.method ?? 'GET';
      // browser peers may be served from another origin: CORS (auth is the Bearer secret, no cookies)
      res.setHeader('access-control-allow-origin', '*');
      res.setHeader('access-control-expose-headers', 'content-range, content-length, accept-ranges');
      if (method === 'OPTIONS') {
        res.writeHead(204, { 'access-control-allow-headers': 'authorization, range, x-mesh-peer, content-type', 'access-control-allow-methods': 'GET, HEAD, POST, DELETE, OPTIONS', 'access-control-max-age': '600' });
        return void res.end();
      }
      const modelFile = /^\/models\/([^/]+)\.gguf$/.exec(path);
      if (modelFile && (method === 'GET' || method === 'HEAD')) {
        const allowed = requireAuth(req);
        const file = localFiles.get(modelFile[1]!);
        if (!file || !allowed.some((r) => r.model.id === file.modelId)) throw new MeshError('NOT_FOUND', `no model file ${modelFile[1]}.gguf in the rooms this secret opens`);
        return serveFile(req, res, file.path, file.size, fetchLogs.get(file.modelId)!, file.file);
      }
      const allowed = requireAuth(req);
      let m: RegExpExecArray | null;
      if (method === 'GET' && (m = /^\/v1\/models\/([^/]+)\/fetches$/.exec(path))) {
        if (!allowed.some((r) => r.model.id === m![1])) throw new MeshError('NOT_FOUND', `no model ${m[1]}`);
        return sendJson(res, 200, { model: m[1], clients: fetchLogs.get(m[1]!)?.byClient() ?? {} });
      }
      if (method === 'GET' && (m = /^\/v1\/models\/([^/]+)\/(manifest|header)$/.exec(path))) {
        // browser peers verify against the manifest and build their config from the header (no model bytes)
        const room = allowed.find((r) => r.model.id === m![1]);
        if (!room) throw new MeshError('NOT_FOUND', `no model ${m[1]}`);
        if (m[2] === 'header') return sendJson(res, 200, headerToWire(room.model.header));
        let manifest = manifests.get(room.model.id);
        if (!manifest) manifests.set(room.model.id, (manifest = loadOrBuildManifest(room.model.location)));
        return sendJson(res, 200, await manifest.catch((e) => (manifests.delete(room.model.id), Promise.reject(e))));
      }
      if (method === 'GET' && (m = /^\/v1\/rooms\/([^/]+)\/events$/.exec(path))) {
        const room = allowed.find((r) => r.id === m![1]);
        if (!room) throw new MeshError('NOT_FOUND', `no room ${m[1]} for this secret`);
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
        const unsubscribe = room.subscribe((e) => res.write(`event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`));
        req.on('close', unsubscribe);
        return;
      }
      if (method === 'GET' && (m = /^\/v1\/rooms\/([^/]+)(\/peers)?$/.exec(path))) {
        const room = allowed.find((r) => r.id === m![1]);
        if (!room) throw new MeshError('NOT_FOUND', `no room ${m[1]} for this secret`);
        if (!m[2]) return sendJson(res, 200, room.summary());
        return sendJson(res, 200, { roomId: room.id, peers: [...room.peers.keys()].map((id) => room.peerSummary(id)), relayed: Object.fromEntries(relayLedgers.get(room.id) ?? []) });
      }
      if (method === 'GET' && path === '/v1/rooms') return sendJson(res, 200, { rooms: allowed.map((r) => r.summary()) });
      if (method === 'GET' && path === '/v1/routes') return sendJson(res, 200, { routes: allowed.flatMap((r) => r.routes.map((x) => x.summary())) });
      if (method === 'GET' && (m = /^\/v1\/routes\/(\d+)$/.exec(path))) {
        const r = findRoute(Number(m[1]));
        if (!r || !allowed.includes(r.room)) throw new MeshError('ROUTE_UNKNOWN', `no route ${m[1]}`);
        return sendJson(res, 200, r.summary());
      }
      if (await handleOpenAi(req, res, allowed, { sessions })) return;
      if (method === 'GET' && (m = /^\/v1\/sessions\/([0-9a-f]{32})\/events$/.exec(path))) {
        const sid = m[1]!;
        const r = findRoute(sessions.brief(sid).routeId);
        if (!r || !allowed.includes(r.room)) throw new MeshError('AUTH_FAILED', `the secret does not open session ${sid}'s room`);
        return streamSessionEvents(req, res, sid);
      }
      const handled = await handleFrameHttp(req, res, async (f) => {
        roomOfFrame(f, allowed);
        return sessions.handle(f);
      });
      if (handled) return;
      throw new MeshError('NOT_FOUND', `${method} ${path} is not served here`);
    } catch (e) {
      if (!res.headersSent) sendError(res, e);
      else res.destroy();
    }
  }

  /** GET /v1/sessions/{id}/events: the session's telemetry as Server-Sent Events, replayed from its start. */
  function streamSessionEvents(req: IncomingMessage, res: ServerResponse, sid: string): void {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
    let unsubscribe: (() => void) | null = null;
    const end = (): void => {
      unsubscribe?.();
      if (!res.writableEnded) res.end();
    };
    unsubscribe = sessions.subscribe(sid, (e) => {
      if (res.writableEnded) return;
      res.write(`event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`);
      if (e.type === 'session_state' && ['closed', 'expired', 'failed'].includes(e.state)) setImmediate(end);
    });
    req.on('close', end);
  }

  server.on('upgrade', (req, socket, head) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    const m = /^\/v1\/rooms\/([^/]+)\/(peer|client)$/.exec(path);
    const room = m ? rooms.find((r) => r.id === m[1]) : undefined;
    if (!m || !room) {
      socket.end('HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 0\r\n\r\n');
      return;
    }
    if (m[2] === 'client' && !secretMatches(bearerOf(req), room.secret)) {
      socket.end('HTTP/1.1 401 Unauthorized\r\nconnection: close\r\ncontent-length: 0\r\n\r\n');
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => (m[2] === 'peer' ? admitPeer(room, ws) : serveClient(room, ws)));
  });

  function serveClient(room: Room, ws: WebSocket): void {
    const owner = ws;
    serveFrames(ws, async (f) => {
      roomOfFrame(f, [room]);
      return sessions.handle(f, owner);
    });
    ws.on('close', () => void sessions.ownerGone(owner));
  }

  function admitPeer(room: Room, ws: WebSocket): void {
    const nonce = randomBytes(16).toString('hex');
    const expectedProof = helloProof(room.secret, nonce);
    let peer: ReturnType<Room['addPeer']> | null = null;
    let helloSeen = false;
    const refuse = (code: string, message: string): void => {
      ws.send(JSON.stringify({ t: 'error', code, message }));
      ws.close(4401, code);
    };
    const helloTimer = setTimeout(() => !peer && refuse('HELLO_TIMEOUT', 'no hello within 10 s'), 10_000);
    helloTimer.unref();
    ws.on('message', (data, isBinary) => {
      if (isBinary) return; // frame replies: the peer's WsLink reads them
      let msg: PeerToServer;
      try {
        msg = JSON.parse(data.toString()) as PeerToServer;
      } catch {
        return refuse('BAD_MESSAGE', 'control messages are JSON');
      }
      if (!peer) {
        if (msg.t !== 'hello' || helloSeen) return refuse('BAD_MESSAGE', 'the first message must be hello, and the only one until welcome');
        helloSeen = true;
        const hello = msg;
        void expectedProof.then((proof) => {
          if (!secretMatches(hello.proof, proof)) return refuse('AUTH_FAILED', 'wrong room secret');
          if (ws.readyState !== ws.OPEN) return;
          admitHello(hello);
        });
        return;
      }
      onPeerMessage(peer, msg);
    });

    function admitHello(msg: PeerHello): void {
      clearTimeout(helloTimer);
      const hello: PeerHello = {
        t: 'hello',
        proof: '',
        backend: String(msg.backend),
        memoryBytes: Number(msg.memoryBytes) || 0,
        ...(msg.name ? { name: String(msg.name) } : {}),
        ...(msg.listen ? { listen: String(msg.listen) } : {}),
        ...(msg.httpUrl ? { httpUrl: String(msg.httpUrl) } : {}),
        ...(msg.layers ? { layers: { start: Number(msg.layers.start), end: Number(msg.layers.end) } } : {}),
        ...(typeof msg.artifact === 'string' ? { artifact: msg.artifact } : {}),
        ...(Array.isArray(msg.units) ? { units: msg.units.map(String) } : {}),
        ...(msg.adapter ? { adapter: msg.adapter } : {}),
        ...(isServeCapability(msg.serves) ? { serves: msg.serves } : {}),
      };
      peer = room.addPeer(hello, ws);
    }

    function onPeerMessage(p: NonNullable<typeof peer>, msg: PeerToServer): void {
      const ledger = relayLedgers.get(room.id) ?? relayLedgers.set(room.id, new Map()).get(room.id)!;
      const browserView = {
        sendTo: (id: string, m: unknown) => {
          const to = room.peers.get(id);
          if (!to) return false;
          room.send(to, m as never);
          return true;
        },
        controlOf: (id: string) => room.peers.get(id)?.control ?? null,
        // relayed frames may only go from a stage to the next stage of the current route
        nextStageOf: (id: string) => {
          const st = room.route?.stages.find((x) => x.peerId === id);
          return st ? (room.route!.stages[st.stage + 1]?.peerId ?? null) : null;
        },
      };
      if (handleBrowserPeerMessage(browserView, p.id, msg, (m) => room.send(p, m as never), ledger)) return;
      room.onPeerMessage(p, msg);
    }
    ws.on('close', () => {
      clearTimeout(helloTimer);
      if (peer) room.peerGone(peer, 'connection closed');
    });
    ws.send(JSON.stringify({ t: 'challenge', nonce }));
  }

  return {
    url,
    rooms,
    sessions,
    fetchLogs,
    joinUrl: (room) => `${url}/room/${room.id}#secret=${encodeURIComponent(room.secret)}`,
    addRoom,
    async close() {
      await sessions.dispose();
      for (const r of rooms) r.dispose();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
