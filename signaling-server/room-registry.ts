// The server's rooms: one per model, each with its hosted files (a split GGUF hosts each part),
// fetch log, manifest, relay ledger and routes; the session manager that runs sessions on
// those routes; and which rooms a request's secret opens.

import type { IncomingMessage } from 'node:http';
import { basename } from 'node:path';
import { MeshError } from '../src/errors.ts';
import { isUrl } from '../src/gguf/parse.ts';
import { artifactFiles, readArtifactHeader, splitName } from '../src/gguf/split.ts';
import { loadOrBuildManifest } from '../src/gguf/manifest.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import { checkedServableModel } from '../src/model/model-check.ts';
import type { IceServer } from '../src/protocol/control.ts';
import { FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { SessionManager } from '../src/route/sessions.ts';
import type { SessionManagerOptions } from '../src/route/sessions.ts';
import type { SessionState } from '../src/route/session-state.ts';
import { Access, need } from './access.ts';
import type { CredentialOptions, Grant } from './access.ts';
import { AdmissionGate } from './admission.ts';
import type { AdmissionLimits } from './admission.ts';
import { modelKey, roomIdentity } from './room-identity.ts';
import type { RelayLedger } from './browser-peers.ts';
import { FetchLog, PinnedFile } from './model-host.ts';
import { Room } from './room.ts';
import { iceServersMinting } from './turn.ts';
import type { StagePolicy } from './stage-policy.ts';
import type { RoomOptions } from './room.ts';
import type { Route } from './room-route.ts';

export interface RoomRegistryOptions extends CredentialOptions {
  /** one secret for every room (default: a random one per model, kept under the cache dir) */
  secret?: string;
  /** the session manager's and the API's limits (defaults: SESSION_LIMITS, ADMISSION_DEFAULTS) */
  limits?: Pick<SessionManagerOptions, 'maxFrameTokens' | 'maxSessionsPerClient' | 'maxSessionsPerRoute'> & AdmissionLimits;
  /** a route is planned once this many peers joined (default 1) */
  minPeers?: number;
  /** wait this long after the last join before planning (ms, default 300) */
  planDelayMs?: number;
  /** idle sessions expire after this long (ms, default 5 min) */
  sessionTtlMs?: number;
  /** STUN/TURN servers announced to every peer in welcome */
  iceServers?: IceServer[];
  /** this server's own STUN (signaling-server/stun.ts), named by the address a peer reached; told first in every welcome */
  stunAt?: (reachedAt: string | undefined) => IceServer;
  /** public rooms: trusted peers at the ends, spot checks of the others (room.ts) */
  publicRoom?: RoomOptions['publicRoom'];
  /** a route that loses a stage waits this long for a replacement (ms, default 30 s; 0 = no repair: sessions fail at once) */
  repairTimeoutMs?: number;
  /** spares load their standby shard ahead of time (default true) */
  standby?: boolean;
  /** which planner plans routes (room.ts) */
  planner?: 'speed' | 'memory';
  /** a speed-planned room re-plans an idle route predicted this many times slower than another chain under live figures (speed-replan.ts; default 1.3; 0: never) */
  replanGain?: number;
  /** who may be a stage: a minimum stay and memory (stage-policy.ts; default: anyone, at once) */
  stagePolicy?: StagePolicy;
  /** every pair of peers timed again this often (link-probes.ts; ms, default 30 s; 0: only as peers join) */
  linkProbeMs?: number;
  /** a WebSocket ping to every peer this often (ms, default 0.5 s) */
  heartbeatMs?: number;
  /** a peer silent this long is lost (ms, default 3.5 s) */
  heartbeatTimeoutMs?: number;
  /** a step unanswered this long makes the server probe the route's stages for a stalled one (ms, default 30 s) */
  stepTimeoutMs?: number;
  /** speculative decoding: drafts per route pass for greedy sessions that do not say (route/speculation.ts; default 0: off) */
  speculate?: number;
  /** mint each peer a short-lived credential for the TURN servers in `iceServers` that name none (./turn.ts) */
  turn?: { secret: string; ttlS: number };
  /** route ids start above this (a cluster instance's number << 16, so ids never collide across instances) */
  routeIdBase?: number;
  log: (line: string) => void;
}

/** A model file this server hosts from local disk, opened once (PinnedFile). */
export interface HostedFile {
  modelId: string;
  path: string;
  pinned: PinnedFile;
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

/**
 * A session's changes as log lines: its opening, repairs and end — not the idle ↔ prefilling ↔
 * decoding churn of every step (two lines a token flooded a serving terminal).
 */
function sessionLogger(log: (line: string) => void): (id: string, state: SessionState) => void {
  const repairing = new Set<string>();
  return (id, state) => {
    const churn = state === 'idle' || state === 'prefilling' || state === 'decoding';
    if (churn && !repairing.has(id)) return;
    if (state === 'repairing') repairing.add(id);
    else repairing.delete(id);
    log(`session ${id}: ${churn ? `repaired, ${state}` : state}`);
  };
}

export class RoomRegistry {
  readonly rooms: Room[] = [];
  /** byte ranges each client read, per model hosted from local disk */
  readonly fetchLogs = new Map<string, FetchLog>();
  /** hosted file name (without .gguf) → the local file */
  readonly hostedFiles = new Map<string, HostedFile>();
  readonly sessions: SessionManager;
  /** who may do what (credentials.ts) */
  readonly access: Access;
  /** how many generations run and wait (the OpenAI API's 429) */
  readonly gate: AdmissionGate;
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
      { ...opts.limits, idleTtlMs: opts.sessionTtlMs ?? 5 * 60_000, onChange: sessionLogger(opts.log), ...(opts.stepTimeoutMs ? { stepTimeoutMs: opts.stepTimeoutMs } : {}), ...(opts.speculate ? { speculate: opts.speculate } : {}) },
    );
    this.routeCounter = opts.routeIdBase ?? 0;
    this.access = new Access(opts, () => this.rooms);
    this.gate = new AdmissionGate(opts.limits);
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
    // refused here, at start, what llama.cpp would refuse: lying shapes, missing or extra tensors;
    // an architecture only llama.cpp runs opens a room too (what each peer serves is the planner's question)
    const { nLayer, nCtx } = checkedServableModel(header, location);
    const id = modelIdFor(location, this.taken);
    const remote = isUrl(location);
    const split = art.files.length > 1;
    // hosted as /models/{id}.gguf, or /models/{id}-0000k-of-0000n.gguf per part (llama.cpp's names)
    const hostedNames = art.files.map((_, k) => (split ? `${id}-${String(k + 1).padStart(5, '0')}-of-${String(art.files.length).padStart(5, '0')}` : id));
    if (!remote) {
      for (const [k, f] of art.files.entries()) {
        const pinned = await PinnedFile.open(f.location);
        if (pinned.size !== f.header.fileBytes) throw new MeshError('MODEL_CHANGED', `${f.location} changed while its header was read`);
        this.hostedFiles.set(hostedNames[k]!, { modelId: id, path: f.location, pinned, file: k });
      }
      this.fetchLogs.set(id, new FetchLog());
    }
    // the same model and secret give the same room id after a restart, so join links stay valid
    const identity = roomIdentity(modelKey(id, location, header.fileBytes), this.opts.secret);
    const iceServers = this.iceServers();
    const room = new Room(
      identity.id,
      identity.secret,
      { id, location, header, nLayer, files: art.files.length, contextLength: nCtx || 2048 },
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
        ...(this.opts.publicRoom ? { publicRoom: this.opts.publicRoom } : {}),
        ...(this.opts.planner ? { planner: this.opts.planner } : {}),
        ...(this.opts.replanGain !== undefined ? { replanGain: this.opts.replanGain } : {}),
        ...(this.opts.stagePolicy ? { stagePolicy: this.opts.stagePolicy } : {}),
        ...(this.opts.linkProbeMs !== undefined ? { linkProbeMs: this.opts.linkProbeMs } : {}),
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
  private iceServers(): IceServer[] | ((peerId: string, reachedAt?: string) => IceServer[]) | undefined {
    const servers = this.opts.iceServers ?? [];
    const { stunAt, turn } = this.opts;
    const others = turn && servers.length ? iceServersMinting(servers, turn.secret, turn.ttlS) : () => servers;
    if (stunAt) return (peerId, reachedAt) => [stunAt(reachedAt), ...others(peerId)];
    if (!servers.length) return undefined;
    return turn ? others : servers;
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

  /** What the request's Bearer token opens; AUTH_FAILED when it opens nothing. */
  requireAuth(req: IncomingMessage): Grant {
    return this.access.grantOf(req);
  }

  /**
   * Checks a client's session frame against its grant: the route is in a room it opens, it may
   * run sessions (an API key or the admin), and — unless it is the admin — the session is its
   * own (another caller's is SESSION_UNKNOWN, as if it did not exist).
   */
  checkFrame(f: Frame, grant: Grant): void {
    need(grant, ['api', 'admin'], 'running sessions');
    const routeId = f.type === FrameType.SessionOpen ? f.routeId : this.sessions.brief(f.sessionId).routeId;
    if (f.type !== FrameType.SessionOpen) this.checkOwner(f.sessionId, grant);
    const r = this.findRoute(routeId);
    if (!r) throw new MeshError('ROUTE_UNKNOWN', `no route ${routeId}`);
    if (!grant.rooms.some((room) => room === r.room)) throw new MeshError('AUTH_FAILED', `the credential does not open route ${routeId}'s room`);
  }

  /** SESSION_UNKNOWN unless the grant is the admin's or opened the session itself. */
  checkOwner(sessionId: string, grant: Grant): void {
    if (grant.roles.has('admin') || grant.principal === null) return;
    if (this.sessions.principalOf(sessionId) !== grant.principal) throw new MeshError('SESSION_UNKNOWN', `frame session id: no session ${sessionId}`, { field: 'session id' });
  }

  async dispose(): Promise<void> {
    await this.sessions.dispose();
    for (const r of this.rooms) r.dispose();
    for (const f of this.hostedFiles.values()) await f.pinned.close().catch(() => undefined);
  }
}
