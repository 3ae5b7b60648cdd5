// The server's rooms: one per model, each with its hosted files (a split GGUF hosts each part),
// fetch log, manifest, relay ledger and routes; the session manager that runs sessions on
// those routes; and which rooms a request's secret opens.

import type { IncomingMessage } from 'node:http';
import { randomBytes } from 'node:crypto';
import { basename } from 'node:path';
import { MeshError } from '../src/errors.ts';
import { isUrl } from '../src/gguf/parse.ts';
import { artifactFiles, readArtifactHeader, splitName } from '../src/gguf/split.ts';
import { loadOrBuildManifest } from '../src/gguf/manifest.ts';
import { hyperParameters } from '../src/gguf/summary.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import type { IceServer } from '../src/protocol/control.ts';
import { FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { SessionManager } from '../src/route/sessions.ts';
import { bearerOf, secretMatches } from '../src/transport/frame-server.ts';
import type { RelayLedger } from './browser-peers.ts';
import { FetchLog } from './model-host.ts';
import { Room } from './room.ts';
import { iceServersMinting } from './turn.ts';
import type { StagePolicy } from './stage-policy.ts';
import type { Route } from './room.ts';

export interface RoomRegistryOptions {
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
  /** which planner plans routes (room.ts) */
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
  log: (line: string) => void;
}

/** A model file this server hosts from local disk. */
export interface HostedFile {
  modelId: string;
  path: string;
  size: number;
  /** which file of the artifact (0 unless it is a split GGUF) */
  file: number;
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

export class RoomRegistry {
  readonly rooms: Room[] = [];
  /** byte ranges each client read, per model hosted from local disk */
  readonly fetchLogs = new Map<string, FetchLog>();
  /** hosted file name (without .gguf) → the local file */
  readonly hostedFiles = new Map<string, HostedFile>();
  readonly sessions: SessionManager;
  private readonly relayLedgers = new Map<string, RelayLedger>();
  private readonly manifests = new Map<string, Promise<Manifest>>();
  private readonly taken = new Set<string>();
  private routeCounter = 0;

  /** `url`: this server's own address, which the model URLs of local files name */
  constructor(
    private readonly url: string,
    private readonly opts: RoomRegistryOptions,
  ) {
    this.sessions = new SessionManager(
      (routeId) => {
        const r = this.findRoute(routeId);
        return r && r.status === 'ready' ? r : undefined;
      },
      { idleTtlMs: opts.sessionTtlMs ?? 5 * 60_000, onChange: (id, state) => opts.log(`session ${id}: ${state}`), ...(opts.stepTimeoutMs ? { stepTimeoutMs: opts.stepTimeoutMs } : {}) },
    );
  }

  findRoute(id: number): Route | undefined {
    for (const room of this.rooms) for (const r of room.routes) if (r.id === id) return r;
    return undefined;
  }

  /** Opens a room for a model path or URL; a split GGUF (any part named) is one model. */
  async addRoom(location: string): Promise<Room> {
    // the joined header addresses the parts concatenated
    const art = await readArtifactHeader(location);
    const header = art.header;
    // any architecture opens a room: what each peer can serve of it is the planner's question
    const { n_layer: nLayer } = hyperParameters(header, location);
    const id = modelIdFor(location, this.taken);
    const remote = isUrl(location);
    const split = art.files.length > 1;
    // hosted as /models/{id}.gguf, or /models/{id}-0000k-of-0000n.gguf per part (llama.cpp's names)
    const hostedNames = art.files.map((_, k) => (split ? `${id}-${String(k + 1).padStart(5, '0')}-of-${String(art.files.length).padStart(5, '0')}` : id));
    if (!remote) {
      art.files.forEach((f, k) => this.hostedFiles.set(hostedNames[k]!, { modelId: id, path: f.location, size: f.header.fileBytes, file: k }));
      this.fetchLogs.set(id, new FetchLog());
    }
    const iceServers = this.iceServers();
    const room = new Room(
      randomBytes(6).toString('hex'),
      this.opts.secret ?? randomBytes(18).toString('base64url'),
      { id, location, header, nLayer, files: art.files.length },
      {
        minPeers: this.opts.minPeers ?? 1,
        planDelayMs: this.opts.planDelayMs ?? 300,
        // peers read the first part's URL; the other parts' URLs follow from its name
        modelUrl: remote ? artifactFiles(location)[0]! : `${this.url}/models/${hostedNames[0]}.gguf`,
        // each peer reads a hosted model at the origin it reached this server by (a wildcard bind has many)
        ...(remote ? {} : { modelPath: `/models/${hostedNames[0]}.gguf` }),
        nextRouteId: () => ++this.routeCounter,
        sessions: this.sessions,
        log: this.opts.log,
        ...(iceServers ? { iceServers } : {}),
        ...(this.opts.repairTimeoutMs !== undefined ? { repairTimeoutMs: this.opts.repairTimeoutMs } : {}),
        ...(this.opts.standby === false ? { standby: false } : {}),
        ...(this.opts.planner ? { planner: this.opts.planner } : {}),
        ...(this.opts.stagePolicy ? { stagePolicy: this.opts.stagePolicy } : {}),
      },
    );
    this.rooms.push(room);
    // the manifest (computed once, cached beside a local file) names the artifact peers advertise
    const manifest = loadOrBuildManifest(location);
    this.manifests.set(id, manifest);
    manifest.then(
      (m) => {
        room.artifactSha = m.artifact.sha256;
        this.opts.log(`[room ${room.id}] artifact sha256 ${m.artifact.sha256}`);
      },
      (e) => this.opts.log(`[room ${room.id}] manifest failed: ${(e as Error).message}`),
    );
    return room;
  }

  /** What peers are told in welcome: the configured servers, or per peer with a minted TURN credential. */
  private iceServers(): IceServer[] | ((peerId: string) => IceServer[]) | undefined {
    const servers = this.opts.iceServers;
    if (!servers?.length) return undefined;
    return this.opts.turn ? iceServersMinting(servers, this.opts.turn.secret, this.opts.turn.ttlS) : servers;
  }

  /** The room's manifest; one that failed to build is tried again on the next request. */
  manifestOf(room: Room): Promise<Manifest> {
    let manifest = this.manifests.get(room.model.id);
    if (!manifest) this.manifests.set(room.model.id, (manifest = loadOrBuildManifest(room.model.location)));
    return manifest.catch((e) => (this.manifests.delete(room.model.id), Promise.reject(e)));
  }

  /** Frames relayed between the room's peers, per `from->to` pair. */
  relayLedger(room: Room): RelayLedger {
    let ledger = this.relayLedgers.get(room.id);
    if (!ledger) this.relayLedgers.set(room.id, (ledger = new Map()));
    return ledger;
  }

  /** The rooms whose secret the request presents; AUTH_FAILED when it opens none. */
  requireAuth(req: IncomingMessage): Room[] {
    const token = bearerOf(req);
    const ok = this.rooms.filter((r) => secretMatches(token, r.secret));
    if (ok.length === 0) throw new MeshError('AUTH_FAILED', 'missing or wrong room secret (Authorization: Bearer <secret>)');
    return ok;
  }

  /** Checks that a session frame's route belongs to one of the `allowed` rooms. */
  checkFrameRoom(f: Frame, allowed: Room[]): void {
    const routeId = f.type === FrameType.SessionOpen ? f.routeId : this.sessions.brief(f.sessionId).routeId;
    const r = this.findRoute(routeId);
    if (!r) throw new MeshError('ROUTE_UNKNOWN', `no route ${routeId}`);
    if (!allowed.includes(r.room)) throw new MeshError('AUTH_FAILED', `the secret does not open route ${routeId}'s room`);
  }

  async dispose(): Promise<void> {
    await this.sessions.dispose();
    for (const r of this.rooms) r.dispose();
  }
}
