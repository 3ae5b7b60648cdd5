// The server's HTTP router: the trust files (public), the web app's hook, CORS, /v1/health (no
// credential), then the API — model bytes, fetch logs, manifests and headers, rooms, routes,
// telemetry streams, the OpenAI-compatible API and binary session frames. Every API request
// presents a credential as its Bearer token (access.ts), sees only the rooms it opens, and each
// endpoint names the roles it takes (the table below); an API key sees only its own sessions.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { MeshError } from '../src/errors.ts';
import { headerToWire } from '../src/protocol/header-wire.ts';
import { handleFrameHttp, readBody, sendError, sendJson, SSE_HEAD } from '../src/transport/http.ts';
import type { Cluster } from './cluster.ts';
import { ownerOfRequest, replayed } from './cluster-routing.ts';
import { linkRequest } from './instance-link.ts';
import { resumableBody, resumableCompletion } from './resumable-completion.ts';
import { asksResume, resumeStream } from './stream-resume.ts';
import type { RoomLinks } from './instance-link.ts';
import { serveFile } from './model-host.ts';
import { handleOpenAi } from './openai.ts';
import type { Room } from './room.ts';
import type { RoomRegistry } from './room-registry.ts';
import { need } from './access.ts';
import type { Grant, Role } from './access.ts';
import { serveTrustFiles } from './tls.ts';
import type { ServerTls } from './tls.ts';

/** Answers requests before the API (the web app): true when it answered. */
export type AppHook = (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;

export interface HttpApiOptions {
  /** the web app, answered before the API */
  app?: AppHook;
  /** the certificate served with, whose local CA /tls/ offers (null: plain HTTP) */
  tls?: ServerTls | null;
  /** this server's own address, which the trust files' links name */
  url?: string;
  /** this instance's part in a cluster: requests for what another instance holds go on to it */
  cluster?: Cluster | null;
  /** the requests passed on, by room (ended when the room comes here) */
  linked?: RoomLinks;
}

interface Request {
  req: IncomingMessage;
  res: ServerResponse;
  /** the rooms the request's credential opens */
  allowed: Room[];
  grant: Grant;
  /** the path's captures */
  m: RegExpExecArray;
}

type Endpoint = [methods: string[], path: RegExp, roles: Role[], serve: (r: Request) => unknown];

const OPENAI_PATHS = new Set(['/v1/chat/completions', '/v1/completions', '/v1/models']);


export class HttpApi {
  private readonly endpoints: Endpoint[] = [
    [['GET', 'HEAD'], /^\/models\/([^/]+)\.gguf$/, ['download'], (r) => this.modelFile(r)],
    [['GET'], /^\/v1\/models\/([^/]+)\/fetches$/, ['admin'], (r) => this.fetches(r)],
    // browser peers verify against the manifest and build their config from the header (no model bytes)
    [['GET'], /^\/v1\/models\/([^/]+)\/manifest$/, ['peer', 'admin'], (r) => this.modelDescription(r, 'manifest')],
    // clients tokenize with the header (generate --join, the page's chat)
    [['GET'], /^\/v1\/models\/([^/]+)\/header$/, ['peer', 'api', 'admin'], (r) => this.modelDescription(r, 'header')],
    [['GET'], /^\/v1\/rooms\/([^/]+)\/events$/, ['admin'], (r) => this.roomEvents(r)],
    [['GET'], /^\/v1\/rooms\/([^/]+)\/peers$/, ['admin'], (r) => this.peers(r)],
    [['GET'], /^\/v1\/rooms\/([^/]+)$/, ['peer', 'api', 'admin'], ({ res, allowed, m }) => sendJson(res, 200, this.roomOf(allowed, m[1]!).summary())],
    [['GET'], /^\/v1\/rooms$/, ['admin'], ({ res, allowed }) => sendJson(res, 200, { rooms: allowed.map((r) => r.summary()) })],
    [['GET'], /^\/v1\/routes$/, ['admin'], ({ res, allowed }) => sendJson(res, 200, { routes: allowed.flatMap((r) => r.routes.map((x) => x.summary())) })],
    [['GET'], /^\/v1\/routes\/(\d+)$/, ['admin'], (r) => this.route(r)],
    [['GET'], /^\/v1\/sessions\/([0-9a-f]{32})\/events$/, ['api', 'admin'], (r) => this.sessionEvents(r)],
  ];

  constructor(
    private readonly registry: RoomRegistry,
    private readonly opts: HttpApiOptions = {},
  ) {}

  readonly handle = async (incoming: IncomingMessage, res: ServerResponse): Promise<void> => {
    let req = incoming;
    try {
      // the CA certificate: public, before the app and the secret
      if (serveTrustFiles(this.opts.tls ?? null, req, res, this.opts.url)) return;
      if (this.opts.app && (await this.opts.app(req, res))) return;
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      const method = req.method ?? 'GET';
      // browser peers may be served from another origin: CORS (auth is the Bearer secret, no cookies)
      res.setHeader('access-control-allow-origin', '*');
      res.setHeader('access-control-expose-headers', 'content-range, content-length, accept-ranges');
      if (method === 'OPTIONS') {
        res.writeHead(204, { 'access-control-allow-headers': 'authorization, range, x-mesh-peer, content-type', 'access-control-allow-methods': 'GET, HEAD, POST, DELETE, OPTIONS', 'access-control-max-age': '600' });
        return void res.end();
      }
      if (method === 'GET' && (path === '/v1/health' || path === '/health')) return await this.health(res);
      const cluster = this.opts.cluster;
      const trust = this.opts.tls?.ca ? { ca: this.opts.tls.ca.pem } : {};
      const fromInstance = cluster?.fromInstance(req) ?? false;
      // a broken stream's client back with Last-Event-ID: the rest of it, from the journal (a link from an instance runs the request itself)
      if (!fromInstance && asksResume(req, path)) {
        const grant = this.registry.requireAuth(req);
        need(grant, ['api', 'admin'], path);
        return await resumeStream(req, res, path, await readBody(req, 4 * 1024 * 1024), { cluster: cluster ?? null, grant, trust, ...(this.opts.linked ? { links: this.opts.linked } : {}) });
      }
      if (cluster && !fromInstance) {
        // what another instance holds is answered there (a link from an instance is answered here)
        const owner = await ownerOfRequest(cluster, this.registry, req, path);
        const links = owner.roomId && this.opts.linked ? { roomId: owner.roomId, all: this.opts.linked } : undefined;
        // a completion outlives its holder: asked again of the room's next one (resumable-completion.ts)
        const resumable = owner.target && owner.completion && owner.body ? resumableBody(owner.body) : null;
        if (owner.target && resumable) return await resumableCompletion(cluster, owner.roomId!, req, res, owner.target, resumable, trust, this.opts.linked);
        if (owner.target) return await linkRequest(req, res, owner.target, cluster.linkProof(), owner.body, trust, links);
        if (owner.body) req = replayed(req, owner.body);
      }
      const grant = this.registry.requireAuth(req);
      const allowed = grant.rooms;
      for (const [methods, pattern, roles, serve] of this.endpoints) {
        const m = methods.includes(method) ? pattern.exec(path) : null;
        if (!m) continue;
        need(grant, roles, `${method} ${path}`);
        return void (await serve({ req, res, allowed, grant, m }));
      }
      if (OPENAI_PATHS.has(path)) need(grant, ['api', 'admin'], path);
      // a stream this instance sends its own client is journaled for a reconnect (one passed on is journaled by the instance facing the client)
      const journal = cluster && !fromInstance ? { store: cluster.directory, log: (line: string) => cluster.log(line) } : null;
      if (await handleOpenAi(req, res, allowed, { sessions: this.registry.sessions, gate: this.registry.gate, principal: grant.principal, journal })) return;
      const handled = await handleFrameHttp(req, res, async (f) => {
        this.registry.checkFrame(f, grant);
        return this.registry.sessions.handle(f, undefined, grant.principal);
      });
      if (!handled) throw new MeshError('NOT_FOUND', `${method} ${path} is not served here`);
    } catch (e) {
      if (!res.headersSent) sendError(res, e);
      else res.destroy();
    }
  };

  /**
   * GET /v1/health: readiness for load balancers, no credential (counts only, no ids): 200 when
   * every room's route is ready and the API would admit another request, else 503. In a
   * cluster a room another instance holds counts by the state its holder published, and an
   * instance that cannot reach Redis is not ready (it cannot tell who holds what).
   */
  private async health(res: ServerResponse): Promise<void> {
    const rooms = this.registry.rooms;
    const cluster = this.opts.cluster;
    const c = cluster ? await cluster.health() : null;
    const readyHere = (r: Room): boolean => r.route?.status === 'ready';
    const readyThere = async (r: Room): Promise<boolean> => (await cluster!.directory.roomState<{ route: { status: string } | null }>(r.id).catch(() => null))?.route?.status === 'ready';
    let ready = 0;
    for (const r of rooms) if (!cluster || cluster.holds(r.id) ? readyHere(r) : c?.redis === 'ok' && (await readyThere(r))) ready++;
    const queue = this.registry.gate.counts;
    const ok = rooms.length > 0 && ready === rooms.length && this.registry.gate.open && (!c || c.redis === 'ok');
    sendJson(res, ok ? 200 : 503, { status: ok ? 'ready' : 'not_ready', rooms: rooms.length, readyRooms: ready, queue, sessions: this.registry.sessions.liveCount(), keptSessions: this.registry.sessions.liveCount(true), ...(c ? { cluster: { instance: c.instance, redis: c.redis, holds: c.holds.length } } : {}) });
  }

  private modelFile({ req, res, allowed, m }: Request): Promise<void> {
    const file = this.registry.hostedFiles.get(m[1]!);
    if (!file || !allowed.some((r) => r.model.id === file.modelId)) throw new MeshError('NOT_FOUND', `no model file ${m[1]}.gguf in the rooms this secret opens`);
    return serveFile(req, res, file.pinned, this.registry.fetchLogs.get(file.modelId)!, file.file);
  }

  private fetches({ res, allowed, m }: Request): void {
    if (!allowed.some((r) => r.model.id === m[1])) throw new MeshError('NOT_FOUND', `no model ${m[1]}`);
    sendJson(res, 200, { model: m[1], clients: this.registry.fetchLogs.get(m[1]!)?.byClient() ?? {} });
  }

  private async modelDescription({ res, allowed, m }: Request, what: 'manifest' | 'header'): Promise<void> {
    const room = allowed.find((r) => r.model.id === m[1]);
    if (!room) throw new MeshError('NOT_FOUND', `no model ${m[1]}`);
    if (what === 'header') return sendJson(res, 200, headerToWire(room.model.header));
    sendJson(res, 200, await this.registry.manifestOf(room));
  }

  private roomOf(allowed: Room[], id: string): Room {
    const room = allowed.find((r) => r.id === id);
    if (!room) throw new MeshError('NOT_FOUND', `no room ${id} for this secret`);
    return room;
  }

  /** GET /v1/rooms/{id}/events: route telemetry as Server-Sent Events, recent events first. */
  private roomEvents({ req, res, allowed, m }: Request): void {
    const room = this.roomOf(allowed, m[1]!);
    res.writeHead(200, SSE_HEAD);
    const unsubscribe = room.subscribe((e) => res.write(`event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`));
    req.on('close', unsubscribe);
  }

  private peers({ res, allowed, m }: Request): void {
    const room = this.roomOf(allowed, m[1]!);
    const peers = [...room.peers.keys()].map((id) => room.peerSummary(id));
    sendJson(res, 200, { roomId: room.id, peers, relayed: Object.fromEntries(this.registry.relayLedger(room)) });
  }

  private route({ res, allowed, m }: Request): void {
    const r = this.registry.findRoute(Number(m[1]));
    if (!r || !allowed.some((room) => room === r.room)) throw new MeshError('ROUTE_UNKNOWN', `no route ${m[1]}`);
    sendJson(res, 200, r.summary());
  }

  /** GET /v1/sessions/{id}/events: the session's telemetry as Server-Sent Events, replayed from its start. */
  private sessionEvents({ req, res, allowed, grant, m }: Request): void {
    const sid = m[1]!;
    const sessions = this.registry.sessions;
    this.registry.checkOwner(sid, grant);
    const r = this.registry.findRoute(sessions.brief(sid).routeId);
    if (!r || !allowed.some((room) => room === r.room)) throw new MeshError('AUTH_FAILED', `the credential does not open session ${sid}'s room`);
    res.writeHead(200, SSE_HEAD);
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
}
