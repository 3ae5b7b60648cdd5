// A room: one model artifact, its secret, the peers that joined, and the route planned over
// them. The route's status moves forming → loading → ready; a ready route whose stage loses its
// peer goes repairing and back to ready once a replacement serves the stage (route-repair.ts);
// degraded when a stage is lost with no repair, fails to load, or the repair timed out; closed
// when a new route replaces it (an idle one too, where live speeds say another chain is much
// faster: speed-replan.ts) or the server stops. A peer excluded (a refused shard, a failed spot
// check) loses its stage as if it had left.

import { randomBytes } from 'node:crypto';
import type WebSocket from 'ws';
import { MeshError } from '../src/errors.ts';
import { shardBytes } from '../src/backends/shard.ts';
import type { ShardRange } from '../src/gguf/types.ts';
import type { PlannerPeer } from '../src/route/planner.ts';
import { modelTraits, servable } from '../src/model/serve-capability.ts';
import type { ModelTraits, Servable } from '../src/model/serve-capability.ts';
import { unitsRange } from '../src/peer/verified-source.ts';
import type { IceServer, ModelBrief, PeerHello, PeerToServer, ServerToPeer } from '../src/protocol/control.ts';
import { PublicRoom } from './public-room.ts';
import type { PublicRoomOptions } from './public-room.ts';
import type { SessionManager } from '../src/route/sessions.ts';
import type { FrameLink } from '../src/transport/link.ts';
import type { TelemetryEvent } from '../src/route/telemetry.ts';
import { WsLink } from '../src/transport/ws.ts';
import { deliverReturn } from './token-return.ts';
import { probeStages } from './stall-probe.ts';
import { LinkMatrix } from './link-matrix.ts';
import { LinkProbes } from './link-probes.ts';
import { MEMORY_FAILURE_CODES, memoryLowered, noteMemoryFailure, plannedMemory } from './peer-memory.ts';
import { RouteKeeper } from './route-repair.ts';
import { Route } from './room-route.ts';
import { choosePlan } from './plan-choice.ts';
import { plannedSpeed } from './live-speed.ts';
import { SpeedReplanner } from './speed-replan.ts';
import type { PlannerKind, SpeedFacts } from './plan-choice.ts';
import { shardSources } from './shard-sources.ts';
import type { Downstream, ModelArtifact, RoomHost } from './room-host.ts';
import type { Peer } from './room-peer.ts';
import { OPEN_POLICY, stageCandidates } from './stage-policy.ts';
import type { StagePolicy } from './stage-policy.ts';

/** Replies from a peer's stage to the server (status, tokens, logits) are small: what reassembly may hold. */
const PEER_REPLY_REASSEMBLY = { maxPendingBytes: 32 * 1024 * 1024, maxAgeMs: 30_000 };

export interface RoomOptions {
  minPeers: number;
  planDelayMs: number;
  /** URL peers use to read the model (already absolute) */
  modelUrl: string;
  /** a hosted model's path on this server: each peer reads it at the origin it joined by */
  modelPath?: string;
  nextRouteId: () => number;
  sessions: SessionManager;
  log: (line: string) => void;
  /** STUN/TURN servers announced to peers in welcome (browser peers across the internet) */
  iceServers?: IceServer[] | ((peerId: string, reachedAt?: string) => IceServer[]);
  /** how long a ready route waits for a replacement of a lost stage (ms; 0 = no repair, sessions fail at once) */
  repairTimeoutMs?: number;
  /** spares load their standby shard ahead of time (default true) */
  standby?: boolean;
  /**
   * A public room (visitors donate compute): peers proving `trustedSecret` serve the first and
   * last stages; the first also re-runs `fraction` of sessions through the others' layers, and
   * a stage whose hidden states differ by more than `tolerance` is excluded.
   */
  publicRoom?: PublicRoomOptions;
  /** 'memory' (default): in proportion to memory, in join order; 'speed': by measured speed and round trips where every peer reports a speed */
  planner?: PlannerKind;
  /** a speed-planned room re-plans its idle route when another chain is predicted this many times faster under live figures (speed-replan.ts; default 1.3; 0: never) */
  replanGain?: number;
  /** who may be a stage (stage-policy.ts; default: every peer, at once) */
  stagePolicy?: StagePolicy;
  /** every pair of peers timed again this often (link-probes.ts; ms, default 30 s; 0: only as peers join) */
  linkProbeMs?: number;
}

export class Room implements RoomHost {
  readonly peers = new Map<string, Peer>();
  /** the artifact's sha256 once its manifest is known: advertised units count only for it */
  artifactSha: string | null = null;
  route: Route | null = null;
  readonly routes: Route[] = [];
  private planTimer: NodeJS.Timeout | null = null;
  private peerCounter = 0;
  private listeners = new Set<(e: TelemetryEvent) => void>();
  private traits: ModelTraits | null = null;
  /** recent route events, replayed to a new subscriber */
  private recent: TelemetryEvent[] = [];
  /** spares and repairs */
  readonly keeper: RouteKeeper;
  /** trusted ends and spot checks, in a public room */
  readonly publicRoom: PublicRoom | null;
  private readonly replanner: SpeedReplanner | null;
  /** the measured round trips between peers (link-matrix.ts), asked for as peers join and every while after (link-probes.ts) */
  readonly links = new LinkMatrix();
  private readonly probes: LinkProbes;

  constructor(
    readonly id: string,
    readonly secret: string,
    readonly model: ModelArtifact,
    private readonly opts: RoomOptions,
  ) {
    this.keeper = new RouteKeeper(this, { repairTimeoutMs: opts.repairTimeoutMs ?? 30_000, standby: opts.standby ?? true });
    this.publicRoom = opts.publicRoom ? new PublicRoom(this, opts.publicRoom) : null;
    this.replanner = opts.planner === 'speed' && opts.replanGain !== 0 ? new SpeedReplanner(this, opts.replanGain) : null;
    this.probes = new LinkProbes(this, opts.linkProbeMs);
  }

  get sessions(): SessionManager {
    return this.opts.sessions;
  }

  /** The secret trusted peers prove (public rooms), else null. */
  get trustedSecret(): string | null {
    return this.publicRoom?.opts.trustedSecret ?? null;
  }

  /**
   * Whether `p` may serve stage `stage` of `r`: a public room keeps its ends on trusted peers,
   * and the stage policy's memory floor — which a standby does not need: a peer below it is
   * only ever a spare, warming the shard (stage-policy.ts)
   */
  mayServeStage(p: Peer, r: Route, stage: number, as: 'stage' | 'standby' = 'stage'): boolean {
    if (as === 'stage' && plannedMemory(p) < (this.opts.stagePolicy ?? OPEN_POLICY).minMemoryBytes) return false;
    return this.publicRoom?.mayServe(p, stage, r.stages.length) ?? true;
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

  /** Where `peer` reads the model: a hosted one at the peer's own origin for this server. */
  modelUrlFor(peer: Peer | undefined): string {
    return this.opts.modelPath && peer?.origin ? `${peer.origin}${this.opts.modelPath}` : this.opts.modelUrl;
  }

  brief(peer?: Peer): ModelBrief {
    return { id: this.model.id, url: this.modelUrlFor(peer), nLayer: this.model.nLayer, fileBytes: this.model.header.fileBytes, files: this.model.files };
  }

  addPeer(hello: PeerHello, ws: WebSocket, how: { trusted?: boolean; origin?: string; reachedAt?: string } = {}): Peer {
    const { trusted, origin } = how;
    const id = `${hello.name ? hello.name.replace(/[^A-Za-z0-9_.-]/g, '').slice(0, 24) + '-' : 'peer-'}${++this.peerCounter}${randomBytes(2).toString('hex')}`;
    const peer: Peer = { id, hello, ws, control: WsLink.wrap(ws, `peer ${id}`, { reassembly: PEER_REPLY_REASSEMBLY }), joinedAt: Date.now(), gone: false, ...(origin ? { origin } : {}), ...(trusted ? { trusted } : {}) };
    this.peers.set(id, peer);
    const can = this.servableBy(peer);
    this.log(`peer ${id} joined: ${hello.backend}, ${hello.memoryBytes} bytes${hello.layers ? `, layers ${hello.layers.start}-${hello.layers.end}` : ''}${hello.listen ? `, listening at ${hello.listen}` : ''}; serves ${can.ranges ? 'any layer range' : can.wholeModel ? 'the whole model only' : `nothing of this model (${can.reason})`}`);
    const servers = typeof this.opts.iceServers === 'function' ? this.opts.iceServers(id, how.reachedAt) : this.opts.iceServers;
    const ice = servers?.length ? { iceServers: servers } : {};
    this.send(peer, { t: 'welcome', peerId: id, roomId: this.id, model: this.brief(peer), ...ice });
    this.probes.joined(peer);
    const r = this.route;
    if (r?.repairState) this.keeper.fillWaiting(r);
    else if (r?.status === 'ready') this.keeper.assignStandbys(r);
    this.schedulePlan();
    return peer;
  }

  peerGone(peer: Peer, why: string): void {
    if (peer.gone) return;
    peer.gone = true;
    this.peers.delete(peer.id);
    this.links.drop(peer.id);
    this.probes.gone(peer.id);
    this.log(`peer ${peer.id} left: ${why}`);
    this.stageGone(peer, why);
  }

  /** `peer` can no longer serve its stage (it left, or its device was lost): repair the route, or degrade and replan. */
  stageGone(peer: Peer, why: string): void {
    this.loseStage(peer, 'left', why);
    this.schedulePlan();
  }

  /**
   * The peer's stage of the current route (or the stage it was taking over) is lost: with repair
   * on, a spare takes it and the sessions wait and are rebuilt; else the route degrades and its
   * sessions fail naming the stage. Returns the route it was lost from.
   */
  private loseStage(peer: Peer, how: 'left' | 'excluded', why: string): Route | null {
    this.keeper.spares.delete(peer.id);
    const r = this.route;
    if (!r || r.status === 'closed') return null;
    const st = r.stages.find((s) => s.peerId === peer.id);
    const replacing = this.keeper.replacementStage(r, peer);
    if (!st && replacing === null) return null;
    const stage = st?.stage ?? replacing!;
    const cause = how === 'left' ? why : `excluded: ${why}`;
    // an excluded peer is out for good already; one lost twice is kept out for a while
    if (how === 'left' && !peer.leaving) this.keeper.penalise(peer, `lost while serving stage ${stage}: ${why}`);
    if (this.keeper.stageLost(r, stage, peer.id, cause)) {
      void this.opts.sessions.stageLost(r.id, stage, cause, { peerId: peer.id, repairing: true });
      return r;
    }
    if (st) st.status = 'lost';
    r.setStatus('degraded', `stage ${stage} (${peer.id}) ${how}: ${why}`);
    void this.opts.sessions.stageLost(r.id, stage, cause, { peerId: peer.id });
    return r;
  }

  /** A graceful leave: a stage is handed over first (same path as a repair), then the peer hears leave-ok. */
  peerLeaving(peer: Peer): void {
    peer.leaving = true;
    this.keeper.spares.delete(peer.id);
    const r = this.route;
    const st = r?.stages.find((s) => s.peerId === peer.id);
    if (!r || !st || r.status === 'closed' || !this.keeper.stageLost(r, st.stage, peer.id, 'left gracefully', true)) return this.leaveDone(peer.id, !st);
    this.log(`peer ${peer.id} is leaving: handing stage ${st.stage} over`);
    void this.opts.sessions.stageLost(r.id, st.stage, 'left gracefully (its sessions move to a replacement)', { peerId: peer.id, repairing: true });
  }

  /** Bytes of tensor data shard `range` of this room's model needs. */
  shardBytes(range: ShardRange): number {
    return shardBytes(this.model.header, range, this.model.nLayer);
  }

  /** Tells a leaving peer it may go (`moved`: its stage is served elsewhere). */
  leaveDone(peerId: string, moved: boolean): void {
    const p = this.peers.get(peerId);
    if (p) this.send(p, { t: 'leave-ok', moved });
  }

  /** Asks every stage of `r` for its status at once; one that does not answer in time is lost (stalled: stall-probe.ts). */
  probeStages(r: Route): Promise<void> {
    return probeStages(this, r);
  }

  onPeerMessage(peer: Peer, msg: PeerToServer): void {
    if (msg.t === 'hello') return;
    if (msg.t === 'check') return this.publicRoom?.onReport(peer, msg);
    if (msg.t === 'leave') return this.peerLeaving(peer);
    if (msg.t === 'memory') return memoryLowered(this, peer, msg);
    if (msg.t === 'links-probed') return this.probes.onResults(peer, msg);
    if (msg.t === 'standby-ready' || msg.t === 'standby-failed') return this.keeper.onStandby(peer, msg.t === 'standby-ready', msg.t === 'standby-failed' ? `${msg.code} ${msg.message}` : '', msg);
    const r = this.route;
    if (!r || msg.routeId !== r.id) return;
    if (msg.t === 'rewired') return this.keeper.onRewired(peer, msg.routeId, msg.stage);
    const st = r.stages[msg.stage];
    if (!st) return;
    // a replacement taking over a stage (a graceful leave: the stage still names the leaving peer)
    const replacing = this.keeper.replacementStage(r, peer) === msg.stage;
    if (st.peerId !== peer.id && !replacing) return;
    if (msg.t === 'return') return deliverReturn(this, r, st.stage, msg.frame);
    if (msg.t === 'ready') {
      st.loadMs = msg.loadMs;
      st.bytesRead = msg.bytesRead;
      st.ring = msg.ring === true;
      this.log(`route ${r.id}: stage ${st.stage} ready on ${peer.id} (${msg.bytesRead} bytes read in ${Math.round(msg.loadMs)} ms)`);
      this.emit({ type: 'stage_ready', routeId: r.id, stage: st.stage, loadMs: msg.loadMs, bytesRead: msg.bytesRead });
      if (replacing) return void this.keeper.replacementReady(r, peer);
      st.status = 'ready';
      if (r.stages.every((s) => s.status === 'ready')) void this.announceReady(r);
    } else if (msg.t === 'telemetry') {
      // load progress, hop kind and candidate pair, frames per channel; merged, so the cache facts
      // of the 'ready' report survive the periodic counter reports that follow it
      st.telemetry = { ...st.telemetry, ...msg };
      // ICE's round trip on the data channel to the next stage: a measured link too
      if (msg.candidatePair?.rttMs !== undefined && r.stages[st.stage + 1]) this.links.record(peer.id, r.stages[st.stage + 1]!.peerId, msg.candidatePair.rttMs, 'ice');
    } else if (msg.t === 'loading') {
      st.loading = { bytesDone: msg.bytesDone, bytesTotal: msg.bytesTotal };
      this.emit({ type: 'stage_loading', routeId: r.id, stage: st.stage, bytesDone: msg.bytesDone, bytesTotal: msg.bytesTotal });
    } else if (msg.t === 'load-failed') {
      if (/HASH_MISMATCH/.test(msg.code)) peer.excluded = `${msg.code}: ${msg.message}`;
      const memory = MEMORY_FAILURE_CODES.has(msg.code);
      if (memory) noteMemoryFailure(peer, this.shardBytes(st.shard));
      if (replacing) return this.keeper.replacementFailed(r, peer, `${msg.code} ${msg.message}`);
      st.status = 'failed';
      st.error = { code: msg.code, message: msg.message };
      r.setStatus('degraded', `stage ${st.stage} (${peer.id}) failed to load: ${msg.code} ${msg.message}`);
      // the shard did not fit: plan again now, with less on this peer (never the same range)
      if (memory) this.schedulePlan();
    }
  }

  /** Stage 0's data link: straight to its listen address, else over its control socket. */
  async connectEntry(r: Route): Promise<void> {
    const first = r.stages[0]!;
    const peer = this.peers.get(first.peerId);
    if (!peer) throw new MeshError('STAGE_UNREACHABLE', `stage 0 (${first.peerId}) is not in the room`, { stage: 0 });
    let link: FrameLink = peer.control;
    if (first.listen) {
      try {
        link = await WsLink.connect(first.listen, { headers: { authorization: `Bearer ${this.secret}` } });
      } catch (e) {
        this.log(`route ${r.id}: stage 0 not reachable at ${first.listen} (${(e as Error).message}); using its control socket`);
      }
    }
    const old = r.entryLink;
    r.entryLink = link;
    if (old && old !== link && !this.isControlLink(old)) void old.close();
  }

  private async announceReady(r: Route): Promise<void> {
    await this.connectEntry(r).catch((e: Error) => this.log(`route ${r.id}: ${e.message}`));
    if (this.route !== r || r.status !== 'loading') return;
    r.setStatus('ready');
    this.keeper.assignStandbys(r);
  }

  /** Sends `peer` the assignment of stage `stage` of `r` (its neighbours as the route stands). */
  assignStage(r: Route, stage: number, peer: Peer): void {
    const st = r.stages[stage]!;
    const next = r.stages[stage + 1];
    const nextHello = next ? this.peers.get(next.peerId)?.hello : undefined;
    const upstreamPeer = r.stages[stage - 1]?.peerId ?? null;
    const check = stage === 0 ? this.publicRoom?.checkShard(r) : null;
    const ring = !next ? this.ringOf(r, peer) : null;
    this.send(peer, { t: 'assign', routeId: r.id, stage, shard: { ...st.shard }, nLayer: this.model.nLayer, modelUrl: this.modelUrlFor(peer), ...this.downstreamOf(next?.peerId ?? null, nextHello), upstreamPeer, sources: shardSources(this, peer, st.shard), ...(check ? { check } : {}), ...(ring ? { ring } : {}) });
  }

  /** The ring for the last stage (`last`) of `r`: stage 0's listen address, where both take the ring and no spot check re-runs sessions (a public room). */
  private ringOf(r: Route, last: Peer): { listen: string; peer: string } | null {
    const first = this.peers.get(r.stages[0]!.peerId);
    if (r.stages.length < 2 || this.publicRoom || !first?.hello.listen || first.hello.ring !== true || last.hello.ring !== true) return null;
    return { listen: first.hello.listen, peer: first.id };
  }

  /** How a stage reaches peer `peerId` as its next stage: its listen address, and whether it answers data channels (tabs always do; a native node says so in its hello). */
  downstreamOf(peerId: string | null, hello: PeerHello | undefined): Downstream {
    return { downstream: hello?.listen ?? null, downstreamPeer: peerId, downstreamRtc: hello ? hello.rtc === true || !hello.listen : false };
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
    if (current && (current.status === 'ready' || current.status === 'loading' || current.status === 'repairing')) return;
    const peers = stageCandidates(this, this.opts.stagePolicy ?? OPEN_POLICY);
    if (peers.length < this.opts.minPeers) {
      if (current?.status === 'forming') current.reason = `waiting for peers: ${peers.length} of ${this.opts.minPeers}`;
      return;
    }
    const plannerPeers = this.plannerPeers(peers);
    const unable = peers.filter((p) => !this.servableBy(p).wholeModel);
    const trusted = this.publicRoom ? (id: string) => this.peers.get(id)?.trusted === true : undefined;
    const choice = plannerPeers.length ? choosePlan(this.opts.planner ?? 'memory', this.model.header, this.model.nLayer, plannerPeers, trusted, this.links) : null;
    const plan = choice
      ? choice.plan
      : { ok: false as const, reason: `no peer can serve ${(this.traits ??= modelTraits(this.model.header)).architecture}: ${unable.map((p) => `${p.id} (${p.hello.backend}): ${this.servableBy(p).reason}`).join('; ')}` };
    if (choice?.by === 'speed') this.log(`planned by speed: predicted ${choice.predictedMs!.toFixed(2)} ms per token${choice.memorySplitMs !== undefined ? ` (the memory split: ${choice.memorySplitMs.toFixed(2)} ms)` : ''}`);
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
    for (const st of [...route.stages].reverse()) this.assignStage(route, st.stage, this.peers.get(st.peerId)!);
  }

  /** The stage candidates that can compute this room's model — decided here, before anyone fetches a byte — as the planners take them (speed: the live figure once there is one: live-speed.ts). */
  plannerPeers(peers = stageCandidates(this, this.opts.stagePolicy ?? OPEN_POLICY)): Array<PlannerPeer & SpeedFacts> {
    const able = peers.map((p) => ({ p, can: this.servableBy(p) })).filter(({ can }) => can.wholeModel);
    return able.map(({ p, can }) => ({ id: p.id, memoryBytes: plannedMemory(p), layers: p.hello.layers, held: this.heldRangeOf(p), serves: can.ranges ? 'ranges' : 'whole-model', speed: plannedSpeed(p), rttMs: p.rttMs }));
  }

  /** The idle route is closed and planned anew (speed-replan.ts: live figures say another chain is much faster). */
  replan(why: string): void {
    if (!this.route || this.route.status !== 'ready') return;
    this.log(`route ${this.route.id}: re-planned: ${why}`);
    this.closeRoute(this.route);
    this.plan();
  }

  /** What of this room's model a peer can compute, from the capability its hello advertised. */
  servableBy(p: Peer): Servable {
    this.traits ??= modelTraits(this.model.header);
    return servable(p.hello.serves, this.traits);
  }

  /** The layer range a peer advertises holding verified for this room's artifact. */
  heldRangeOf(p: Peer): ShardRange | undefined {
    if (!this.artifactSha || p.hello.artifact !== this.artifactSha || !p.hello.units) return undefined;
    return unitsRange(p.hello.units) ?? undefined;
  }

  closeRoute(r: Route): void {
    if (r.status === 'closed') return;
    if (r.repairState) this.keeper.giveUp(r, 'the route was replaced');
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
    const can = this.servableBy(p);
    return { id, ...hello, speed: plannedSpeed(p), rttMs: p.rttMs ?? null, links: this.links.of(id), plannedMemoryBytes: plannedMemory(p), excluded: p.excluded ?? null, trusted: p.trusted === true, servable: { ranges: can.ranges, wholeModel: can.wholeModel, reason: can.reason }, joinedAt: p.joinedAt, routeId: stage ? this.route!.id : null, stage: stage?.stage ?? null, stageStatus: stage?.status ?? null };
  }

  summary(): Record<string, unknown> {
    const checks = this.publicRoom ? { spotChecks: this.publicRoom.summary() } : {};
    return { id: this.id, model: this.brief(), planner: this.opts.planner ?? 'memory', peers: this.peers.size, route: this.route ? { id: this.route.id, status: this.route.status, reason: this.route.reason } : null, ...checks };
  }

  /**
   * Takes a peer out of every route of this room from now on (it stays connected, so it does not
   * simply rejoin as a new peer) and treats its stage as lost, as if it had left: a spare takes
   * the stage (or the route degrades and its sessions fail), and the next plan goes without it.
   */
  excludePeer(peer: Peer, reason: string): void {
    if (peer.excluded || peer.gone) return;
    peer.excluded = reason;
    this.log(`peer ${peer.id} excluded: ${reason}`);
    const r = this.loseStage(peer, 'excluded', reason);
    if (r) this.send(peer, { t: 'release', routeId: r.id });
    this.schedulePlan();
  }

  /**
   * This server stops hosting the room (a cluster instance whose lease passed on): its route
   * closes and every peer's socket closes with 1012, so the peers rejoin — through whichever
   * instance they reach, to the room's new holder.
   */
  handOff(why: string): void {
    if (this.planTimer) clearTimeout(this.planTimer);
    this.replanner?.stop();
    this.probes.stop();
    const r = this.route;
    if (r?.repairState) this.keeper.giveUp(r, why);
    if (r) {
      this.closeRoute(r);
      // its sessions cannot be repaired here: they fail now, naming why
      void this.opts.sessions.stageLost(r.id, 0, `the room moved to another instance: ${why}`);
    }
    for (const p of this.peers.values()) p.ws.close(1012, `the room moved to another instance: ${why}`.slice(0, 120));
  }

  dispose(): void {
    if (this.planTimer) clearTimeout(this.planTimer);
    this.replanner?.stop();
    this.probes.stop();
    if (this.route?.repairState) this.keeper.giveUp(this.route, 'the server is stopping');
    if (this.route) this.closeRoute(this.route);
    for (const p of this.peers.values()) p.ws.terminate();
  }
}
