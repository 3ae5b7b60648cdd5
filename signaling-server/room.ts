// A room: one model artifact, its secret, the peers that joined, and the route planned over
// them. The route's status moves forming → loading → ready, to degraded when a stage's peer
// leaves or fails to load, and to closed when a new route replaces it or the server stops.

import { randomBytes } from 'node:crypto';
import type WebSocket from 'ws';
import { MeshError } from '../src/errors.ts';
import type { ShardRange } from '../src/gguf/types.ts';
import type { GgufHeader } from '../src/gguf/types.ts';
import { shardBytes } from '../src/backends/shard.ts';
import { planRoute } from '../src/route/planner.ts';
import { unitsRange } from '../src/peer/verified-source.ts';
import type { IceServer, ModelBrief, PeerHello, PeerToServer, ServerToPeer, SpotCheckReport } from '../src/protocol/control.ts';
import { SpotChecker } from './spot-check.ts';
import type { SpotCheckVerdict } from './spot-check.ts';
import type { RouteHandle, SessionManager } from '../src/route/sessions.ts';
import type { FrameLink } from '../src/transport/link.ts';
import type { TelemetryEvent } from '../src/route/telemetry.ts';
import { WsLink } from '../src/transport/ws.ts';

/** Replies from a peer's stage to the server (status, tokens, logits) are small: what reassembly may hold. */
const PEER_REPLY_REASSEMBLY = { maxPendingBytes: 32 * 1024 * 1024, maxAgeMs: 30_000 };

export type RouteStatus = 'forming' | 'loading' | 'ready' | 'degraded' | 'closed';

export interface Peer {
  id: string;
  hello: PeerHello;
  ws: WebSocket;
  /** frames to the peer's stage over its control socket */
  control: WsLink;
  joinedAt: number;
  gone: boolean;
  /** refused its shard's bytes (hash mismatch), or failed a spot check: stays out of routes for this artifact */
  excluded?: string;
  /** proved the trusted secret (public rooms: may serve the first and last stages) */
  trusted?: boolean;
}

export interface RouteStage {
  stage: number;
  peerId: string;
  shard: ShardRange;
  status: 'loading' | 'ready' | 'failed' | 'lost';
  listen: string | null;
  loadMs?: number;
  bytesRead?: number;
  error?: { code: string; message: string };
  /** bytes of the shard loaded so far (native peers report while loading) */
  loading?: { bytesDone: number; bytesTotal: number };
  /** the stage's own report (browser peers): load progress, hop to the next stage, frame counters */
  telemetry?: Record<string, unknown>;
}

export interface ModelArtifact {
  id: string;
  /** local path, or the URL peers read */
  location: string;
  /** the artifact header: a split GGUF's parts joined, tensors at offsets into the parts concatenated */
  header: GgufHeader;
  nLayer: number;
  /** files of the artifact (a split GGUF has several; peers derive their URLs from modelUrl's name) */
  files: number;
  /** the model's training context: no session declares more */
  contextLength?: number;
}

export class Route implements RouteHandle {
  status: RouteStatus = 'forming';
  reason: string | null = null;
  readonly history: RouteStatus[] = ['forming'];
  entryLink: FrameLink | null = null;
  readonly createdAt = Date.now();

  constructor(
    readonly id: number,
    readonly room: Room,
    readonly stages: RouteStage[],
  ) {}

  setStatus(s: RouteStatus, reason: string | null = null): void {
    if (this.status === s || this.status === 'closed') return;
    this.status = s;
    this.reason = reason;
    this.history.push(s);
    this.room.log(`route ${this.id}: ${s}${reason ? ` (${reason})` : ''}`);
    this.room.emit({ type: 'route_status', routeId: this.id, status: s, reason });
  }

  get contextLimit(): number | undefined {
    return this.room.model.contextLength;
  }

  entry(): FrameLink {
    if (this.status !== 'ready' || !this.entryLink) throw new MeshError('ROUTE_NOT_READY', `route ${this.id} is ${this.status}${this.reason ? `: ${this.reason}` : ''}`);
    return this.entryLink;
  }

  stageLinks(): Array<FrameLink | null> {
    return this.stages.map((s) => {
      const p = this.room.peers.get(s.peerId);
      return p && !p.gone ? p.control : null;
    });
  }

  stagePeers(): string[] {
    return this.stages.map((s) => s.peerId);
  }

  summary(): Record<string, unknown> {
    return {
      id: this.id,
      roomId: this.room.id,
      model: this.room.model.id,
      status: this.status,
      reason: this.reason,
      history: this.history,
      stages: this.stages.map((s) => ({ ...s, peer: this.room.peerSummary(s.peerId) })),
    };
  }
}

export interface RoomOptions {
  minPeers: number;
  planDelayMs: number;
  /** URL peers use to read the model (already absolute) */
  modelUrl: string;
  nextRouteId: () => number;
  sessions: SessionManager;
  log: (line: string) => void;
  /** STUN/TURN servers announced to peers in welcome (browser peers across the internet) */
  iceServers?: IceServer[];
  /**
   * A public room (visitors donate compute): peers proving `trustedSecret` serve the first and
   * last stages; the first also re-runs `fraction` of sessions through the others' layers, and
   * a stage whose hidden states differ by more than `tolerance` is excluded.
   */
  publicRoom?: { trustedSecret: string; fraction: number; tolerance: number };
}

export class Room {
  readonly peers = new Map<string, Peer>();
  /** the artifact's sha256 once its manifest is known: advertised units count only for it */
  artifactSha: string | null = null;
  route: Route | null = null;
  readonly routes: Route[] = [];
  private planTimer: NodeJS.Timeout | null = null;
  private peerCounter = 0;
  private listeners = new Set<(e: TelemetryEvent) => void>();
  /** recent route events, replayed to a new subscriber */
  private recent: TelemetryEvent[] = [];

  /** public rooms: where the first stage's re-runs meet the last stage's view */
  readonly checker: SpotChecker | null;
  /** sessions the last stage was told to watch */
  private readonly watching = new Set<string>();

  constructor(
    readonly id: string,
    readonly secret: string,
    readonly model: ModelArtifact,
    private readonly opts: RoomOptions,
  ) {
    this.checker = opts.publicRoom ? new SpotChecker(opts.publicRoom.tolerance, (v) => !v.ok && this.spotCheckFailed(v)) : null;
  }

  /** The secret trusted peers prove (public rooms), else null. */
  get trustedSecret(): string | null {
    return this.opts.publicRoom?.trustedSecret ?? null;
  }

  log(line: string): void {
    this.opts.log(`[room ${this.id}] ${line}`);
  }

  /** Route telemetry (planned, loading progress, stage ready, status) for GET /v1/rooms/{id}/events. */
  emit(e: TelemetryEvent): void {
    this.recent.push(e);
    if (this.recent.length > 200) this.recent.shift();
    for (const l of this.listeners) l(e);
  }

  subscribe(listener: (e: TelemetryEvent) => void): () => void {
    for (const e of this.recent) listener(e);
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  brief(): ModelBrief {
    return { id: this.model.id, url: this.opts.modelUrl, nLayer: this.model.nLayer, fileBytes: this.model.header.fileBytes, files: this.model.files };
  }

  addPeer(hello: PeerHello, ws: WebSocket, trusted = false): Peer {
    const id = `${hello.name ? hello.name.replace(/[^A-Za-z0-9_.-]/g, '').slice(0, 24) + '-' : 'peer-'}${++this.peerCounter}${randomBytes(2).toString('hex')}`;
    const peer: Peer = { id, hello, ws, control: WsLink.wrap(ws, `peer ${id}`, { reassembly: PEER_REPLY_REASSEMBLY }), joinedAt: Date.now(), gone: false, ...(trusted ? { trusted } : {}) };
    this.peers.set(id, peer);
    this.log(`peer ${id} joined: ${hello.backend}, ${hello.memoryBytes} bytes${hello.layers ? `, layers ${hello.layers.start}-${hello.layers.end}` : ''}${hello.listen ? `, listening at ${hello.listen}` : ''}`);
    const ice = this.opts.iceServers?.length ? { iceServers: this.opts.iceServers } : {};
    this.send(peer, { t: 'welcome', peerId: id, roomId: this.id, model: this.brief(), ...ice });
    this.schedulePlan();
    return peer;
  }

  peerGone(peer: Peer, why: string): void {
    if (peer.gone) return;
    peer.gone = true;
    this.peers.delete(peer.id);
    this.log(`peer ${peer.id} left: ${why}`);
    this.loseStage(peer, 'left', why);
    this.schedulePlan();
  }

  /** The peer's stage of the current route is lost: the route degrades and its sessions fail over (stageLost). Returns the route it was lost from. */
  private loseStage(peer: Peer, how: string, why: string): Route | null {
    const r = this.route;
    const st = r?.stages.find((s) => s.peerId === peer.id);
    if (!r || !st || r.status === 'closed') return null;
    st.status = 'lost';
    r.setStatus('degraded', `stage ${st.stage} (${peer.id}) ${how}: ${why}`);
    void this.opts.sessions.stageLost(r.id, st.stage, how === 'left' ? why : `${how}: ${why}`);
    return r;
  }

  onPeerMessage(peer: Peer, msg: PeerToServer): void {
    const r = this.route;
    if (msg.t === 'check') return this.onSpotCheck(peer, msg);
    if (msg.t === 'hello' || !r || msg.routeId !== r.id) return;
    const st = r.stages[msg.stage];
    if (!st || st.peerId !== peer.id) return;
    if (msg.t === 'ready') {
      st.status = 'ready';
      st.loadMs = msg.loadMs;
      st.bytesRead = msg.bytesRead;
      this.log(`route ${r.id}: stage ${st.stage} ready on ${peer.id} (${msg.bytesRead} bytes read in ${Math.round(msg.loadMs)} ms)`);
      this.emit({ type: 'stage_ready', routeId: r.id, stage: st.stage, loadMs: msg.loadMs, bytesRead: msg.bytesRead });
      if (r.stages.every((s) => s.status === 'ready')) void this.announceReady(r);
    } else if (msg.t === 'telemetry') {
      st.telemetry = msg; // browser peers: load progress, hop kind (webrtc | relay), frames per channel
    } else if (msg.t === 'loading') {
      st.loading = { bytesDone: msg.bytesDone, bytesTotal: msg.bytesTotal };
      this.emit({ type: 'stage_loading', routeId: r.id, stage: st.stage, bytesDone: msg.bytesDone, bytesTotal: msg.bytesTotal });
    } else if (msg.t === 'load-failed') {
      st.status = 'failed';
      st.error = { code: msg.code, message: msg.message };
      if (/HASH_MISMATCH/.test(msg.code)) peer.excluded = `${msg.code}: ${msg.message}`;
      r.setStatus('degraded', `stage ${st.stage} (${peer.id}) failed to load: ${msg.code} ${msg.message}`);
    }
  }

  /** Stage 0's data link: straight to its listen address, else over its control socket. */
  private async announceReady(r: Route): Promise<void> {
    const first = r.stages[0]!;
    const peer = this.peers.get(first.peerId);
    if (!peer) return;
    let link: FrameLink = peer.control;
    if (first.listen) {
      try {
        link = await WsLink.connect(first.listen, { headers: { authorization: `Bearer ${this.secret}` } });
      } catch (e) {
        this.log(`route ${r.id}: stage 0 not reachable at ${first.listen} (${(e as Error).message}); using its control socket`);
      }
    }
    if (this.route !== r || r.status !== 'loading') {
      if (link !== peer.control) void link.close();
      return;
    }
    r.entryLink = link;
    r.setStatus('ready');
  }

  schedulePlan(): void {
    if (this.planTimer) clearTimeout(this.planTimer);
    this.planTimer = setTimeout(() => {
      this.planTimer = null;
      // a timer's throw would end the server: a plan that cannot be made is the route's reason
      try {
        this.plan();
      } catch (e) {
        this.log(`planning failed: ${(e as Error).message}`);
        if (this.route && this.route.status !== 'closed') this.route.reason = `planning failed: ${(e as Error).message}`;
      }
    }, this.opts.planDelayMs);
    this.planTimer.unref();
  }

  /** Plans a new route when there is none or the current one cannot serve. */
  plan(): void {
    const current = this.route;
    if (current && (current.status === 'ready' || current.status === 'loading')) return;
    const peers = [...this.peers.values()].filter((p) => !p.gone && !p.excluded);
    if (peers.length < this.opts.minPeers) {
      if (current?.status === 'forming') current.reason = `waiting for peers: ${peers.length} of ${this.opts.minPeers}`;
      return;
    }
    const plan = planRoute({
      nLayer: this.model.nLayer,
      peers: peers.map((p) => ({ id: p.id, memoryBytes: p.hello.memoryBytes, layers: p.hello.layers, held: this.heldRange(p) })),
      shardBytes: (range) => shardBytes(this.model.header, range, this.model.nLayer),
      ...(this.opts.publicRoom ? { trusted: (id: string) => this.peers.get(id)?.trusted === true } : {}),
    });
    if (current && current.status === 'forming' && !plan.ok) {
      current.reason = plan.reason;
      return;
    }
    if (current) this.closeRoute(current);
    const route = new Route(
      this.opts.nextRouteId(),
      this,
      plan.ok ? plan.stages.map((s, i) => ({ stage: i, peerId: s.peerId, shard: s.shard, status: 'loading', listen: this.peers.get(s.peerId)!.hello.listen ?? null })) : [],
    );
    this.route = route;
    this.routes.push(route);
    if (!plan.ok) {
      route.reason = plan.reason;
      this.log(`route ${route.id}: forming (${plan.reason})`);
      return;
    }
    this.emit({ type: 'route_planned', routeId: route.id, stages: route.stages.map((st) => ({ stage: st.stage, peerId: st.peerId, start: st.shard.start, end: st.shard.end })) });
    route.setStatus('loading');
    // downstream first: the last stage starts loading before the ones that will send to it
    for (const st of [...route.stages].reverse()) {
      const next = route.stages[st.stage + 1];
      const downstream = next ? (this.peers.get(next.peerId)?.hello.listen ?? null) : null;
      const upstreamPeer = route.stages[st.stage - 1]?.peerId ?? null;
      const check = st.stage === 0 ? this.checkShard(route) : null;
      this.send(this.peers.get(st.peerId)!, { t: 'assign', routeId: route.id, stage: st.stage, shard: st.shard, nLayer: this.model.nLayer, modelUrl: this.opts.modelUrl, downstream, downstreamPeer: next?.peerId ?? null, upstreamPeer, ...(check ? { check } : {}) });
    }
  }

  /** Public rooms with checks on: the layers between the trusted ends, which the first stage re-runs. */
  private checkShard(route: Route): { shard: ShardRange; fraction: number } | null {
    const p = this.opts.publicRoom;
    if (!p || p.fraction <= 0 || route.stages.length < 3) return null;
    return { shard: { start: route.stages[1]!.shard.start, end: route.stages.at(-2)!.shard.end }, fraction: p.fraction };
  }

  /** One half of a spot check, from the route's trusted first or last stage only. */
  private onSpotCheck(peer: Peer, msg: SpotCheckReport): void {
    const r = this.route;
    if (!this.checker || !r || r.status !== 'ready' || msg.routeId !== r.id || !peer.trusted) return;
    const first = r.stages[0]!;
    const last = r.stages.at(-1)!;
    if (msg.role === 'expected' && first.peerId !== peer.id) return;
    if (msg.role === 'actual' && last.peerId !== peer.id) return;
    if (msg.role === 'expected' && !this.watching.has(msg.sessionId)) {
      // the last stage reports only what it is asked for: the donors cannot tell which sessions are checked
      this.watching.add(msg.sessionId);
      if (this.watching.size > 10_000) this.watching.delete(this.watching.values().next().value!);
      const lastPeer = this.peers.get(last.peerId);
      if (lastPeer) this.send(lastPeer, { t: 'watch', routeId: r.id, sessionId: msg.sessionId });
    }
    this.checker.report(msg);
  }

  /** A check failed: every untrusted stage between the trusted ends computed the difference together; all are excluded. */
  private spotCheckFailed(v: SpotCheckVerdict): void {
    const r = this.route;
    if (!r || r.id !== v.routeId) return;
    const reason = `spot check of session ${v.sessionId} at position ${v.position}: hidden states differ from a trusted re-run by ${v.error.toExponential(2)} (tolerance ${this.opts.publicRoom!.tolerance})`;
    for (const st of r.stages.slice(1, -1)) {
      const p = this.peers.get(st.peerId);
      if (p && !p.trusted) this.excludePeer(p, reason);
    }
  }

  /**
   * Takes a peer out of every route of this room from now on (it stays connected, so it does not
   * simply rejoin as a new peer) and treats its stage as lost, as if it had left: the route
   * degrades, its sessions fail over (session repair, issue 14, picks them up from stageLost),
   * and the next plan goes without it.
   */
  excludePeer(peer: Peer, reason: string): void {
    if (peer.excluded || peer.gone) return;
    peer.excluded = reason;
    this.log(`peer ${peer.id} excluded: ${reason}`);
    const r = this.loseStage(peer, 'excluded', reason);
    if (r) this.send(peer, { t: 'release', routeId: r.id });
    this.schedulePlan();
  }

  /** The layer range a peer advertises holding verified for this room's artifact. */
  private heldRange(p: Peer): ShardRange | undefined {
    if (!this.artifactSha || p.hello.artifact !== this.artifactSha || !p.hello.units) return undefined;
    return unitsRange(p.hello.units) ?? undefined;
  }

  closeRoute(r: Route): void {
    if (r.status === 'closed') return;
    r.setStatus('closed');
    if (r.entryLink && !this.isControlLink(r.entryLink)) void r.entryLink.close();
    for (const st of r.stages) {
      const p = this.peers.get(st.peerId);
      if (p && !p.gone) this.send(p, { t: 'release', routeId: r.id });
    }
  }

  private isControlLink(l: FrameLink): boolean {
    return [...this.peers.values()].some((p) => p.control === l);
  }

  send(peer: Peer, msg: ServerToPeer): void {
    if (peer.ws.readyState === peer.ws.OPEN) peer.ws.send(JSON.stringify(msg));
  }

  peerSummary(id: string): Record<string, unknown> | null {
    const p = this.peers.get(id);
    if (!p) return null;
    const { proof: _proof, t: _t, ...hello } = p.hello;
    const stage = this.route?.stages.find((s) => s.peerId === id);
    return { id, ...hello, excluded: p.excluded ?? null, trusted: p.trusted === true, joinedAt: p.joinedAt, routeId: stage ? this.route!.id : null, stage: stage?.stage ?? null, stageStatus: stage?.status ?? null };
  }

  summary(): Record<string, unknown> {
    const checks = this.checker ? { spotChecks: { passed: this.checker.passed, failed: this.checker.failed, tolerance: this.checker.tolerance } } : {};
    return { id: this.id, model: this.brief(), peers: this.peers.size, route: this.route ? { id: this.route.id, status: this.route.status, reason: this.route.reason } : null, ...checks };
  }

  dispose(): void {
    if (this.planTimer) clearTimeout(this.planTimer);
    if (this.route) this.closeRoute(this.route);
    for (const p of this.peers.values()) p.ws.terminate();
  }
}
