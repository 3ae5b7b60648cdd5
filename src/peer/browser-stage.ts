// A tab's stage, once it has joined: PeerCore takes the server's assignments; this side loads
// the assigned slice (cache first, then HTTP Range, every tensor verified) into the backend
// (the WebGPU worker by default), links the stage to its neighbours over WebRTC data channels
// or the server relay (hops.ts), keeps the state the page shows, and reports telemetry.

import { MeshError } from '../errors.ts';
import { shardBytes } from '../backends/shard.ts';
import type { ShardRange, StageBackend } from '../backends/types.ts';
import type { CandidatePair, HopKind, PeerTelemetry, PipeCounters } from '../protocol/control.ts';
import { servePipe } from '../transport/webrtc-link.ts';
import type { ShardCache } from '../storage/shard-cache.ts';
import { evictedUnits, storageEstimate } from '../storage/persistence.ts';
import type { StorageStatus } from '../storage/persistence.ts';
import type { BrowserCapabilities } from './capabilities.ts';
import type { ControlSocket } from './control-socket.ts';
import { Hops } from './hops.ts';
import { modelHeaders, PeerCore, progressGate } from './peer-core.ts';
import type { Assignment, LoadContext, NextLink, NextStage, RoomModel, ShardLoad } from './peer-core.ts';
import { budgetAfterFailure } from './memory-probe.ts';
import { ShardExchange } from './shard-exchange.ts';
import type { ExchangeCounters } from './shard-exchange.ts';
import { loadSlice, sliceSource } from './slice-loader.ts';
import type { LoadedSlice, SliceProgress } from './slice-loader.ts';

export type PeerStatus = 'joining' | 'idle' | 'loading' | 'ready' | 'failed' | 'client-only' | 'reconnecting' | 'closed';

export interface BrowserPeerState {
  status: PeerStatus;
  reason: string | null;
  peerId: string | null;
  roomId: string;
  capabilities: BrowserCapabilities | null;
  artifact: string | null;
  /** bytes of the room's model (all files) */
  modelBytes: number | null;
  heldUnits: string[];
  /** the shard cache's storage: persistent or not, quota and usage, units found evicted */
  storage: StorageStatus | null;
  /** shard bytes this tab sent to other peers loading them */
  served: ExchangeCounters;
  routeId: number | null;
  stage: number | null;
  shard: ShardRange | null;
  progress: SliceProgress | null;
  load: Omit<LoadedSlice, 'tensors' | 'cacheError'> & { cacheError: string | null } | null;
  error: { code: string; message: string } | null;
  hop: HopKind | null;
  /** the data channel's selected ICE candidate pair, when the hop is WebRTC */
  candidatePair: CandidatePair | null;
  downstreamChannel: PipeCounters | null;
  upstreamChannels: Record<string, PipeCounters>;
  relayed: { frames: number; bytes: number } | null;
  /** a spare's standby shard, loaded ahead of taking over a stage */
  standby: { shard: ShardRange; load: Omit<LoadedSlice, 'tensors' | 'cacheError'> & { cacheError: string | null } } | null;
}

export function joiningState(roomId: string): BrowserPeerState {
  return {
    status: 'joining', reason: null, peerId: null, roomId, capabilities: null, artifact: null, modelBytes: null, heldUnits: [], storage: null, served: { servedTensors: 0, servedBytes: 0 },
    routeId: null, stage: null, shard: null, progress: null, load: null, error: null,
    hop: null, candidatePair: null, downstreamChannel: null, upstreamChannels: {}, relayed: null, standby: null,
  };
}

export interface BrowserStageOptions {
  base: string;
  secret: string;
  model: RoomModel;
  control: ControlSocket;
  cache: ShardCache | null;
  state: BrowserPeerState;
  /** told after every state change */
  changed: () => void;
  backend: () => Promise<StageBackend>;
  iceServers?: RTCIceServer[];
  iceTransportPolicy?: RTCIceTransportPolicy;
  rtcTimeoutMs?: number;
  /** false: ignore the shard sources the server names */
  peerShards?: boolean;
  log: (line: string) => void;
}

/** Load failures that mean this tab could not keep the shard: its budget is lowered and the server told. */
const MEMORY_FAILURES = new Set(['WEBGPU_OUT_OF_MEMORY', 'WEBGPU_DEVICE_LOST']);

export class BrowserStage {
  readonly core: PeerCore;
  readonly hops: Hops;
  /** shard bytes to and from other peers */
  readonly exchange: ShardExchange;
  private iceServers: RTCIceServer[] | undefined;
  /** the only peer whose data channel this stage answers: the assigned previous stage */
  private upstreamPeer: string | null = null;
  private downstreamSeq = 0;

  constructor(private readonly o: BrowserStageOptions) {
    const { control, state } = o;
    this.core = new PeerCore({
      secret: o.secret,
      send: (m) => control.sendJson(m),
      log: o.log,
      loadShard: (ctx) => this.load(ctx),
      linkNext: (next, ctx) => this.connectNext(next, ctx),
      onAssign: (a) => (this.upstreamPeer = a.upstreamPeer ?? null),
      onUpstream: (peerId) => (this.upstreamPeer = peerId),
      onReady: (a) => this.ready(a),
      onFailed: (a, err) => {
        this.update({ status: 'failed', error: { code: err.code, message: err.message } });
        if (MEMORY_FAILURES.has(err.code)) void this.lowerBudget(a, err.code, err.message);
      },
      onRelease: () => this.update({ status: 'idle', routeId: null, stage: null, shard: null, hop: null }),
    });
    servePipe(control.frames, this.core.handle, { smallMessageBytes: control.frames.maxMessageSize });
    this.hops = new Hops({
      sendJson: (m) => control.sendJson(m),
      handler: this.core.handle,
      acceptFrom: (id) => id === this.upstreamPeer,
      ...(o.iceServers ? { iceServers: o.iceServers } : {}),
      ...(o.iceTransportPolicy ? { iceTransportPolicy: o.iceTransportPolicy } : {}),
      ...(o.rtcTimeoutMs ? { timeoutMs: o.rtcTimeoutMs } : {}),
      log: o.log,
    });
    state.upstreamChannels = this.hops.upstreamChannels;
    this.iceServers = o.iceServers;
    this.exchange = new ShardExchange({
      manifest: o.model.manifest,
      cache: o.cache,
      sendJson: (m) => control.sendJson(m),
      iceServers: () => this.iceServers,
      ...(o.iceTransportPolicy ? { iceTransportPolicy: o.iceTransportPolicy } : {}),
      ...(o.rtcTimeoutMs ? { timeoutMs: o.rtcTimeoutMs } : {}),
      onServed: () => o.changed(),
      log: o.log,
    });
    state.served = this.exchange.counters;
    control.onJson((m) => {
      if (this.core.onMessage(m)) return;
      if (m.t === 'signal') {
        if (ShardExchange.owns(m)) this.exchange.onSignal(m);
        else this.hops.onSignal(m);
      } else if (m.t === 'relay-reply') this.hops.onRelayReply(m);
    });
  }

  private update(s: Partial<BrowserPeerState>): void {
    Object.assign(this.o.state, s);
    this.o.changed();
  }

  /** PeerCore's `loadShard`: the slice (cache first, then Range requests, verified), into the backend. A spare's standby load changes no stage state. */
  private async load(ctx: LoadContext): Promise<ShardLoad> {
    const { state, cache, model } = this.o;
    const a = ctx.assignment;
    const standby = a.t === 'standby';
    if (!standby) this.update({ status: 'loading', routeId: a.routeId, stage: a.stage, shard: { ...a.shard }, progress: null, load: null, error: null, hop: null, candidatePair: null, downstreamChannel: null, relayed: null });
    const due = progressGate(250);
    const slice = await loadSlice({
      manifest: model.manifest,
      modelUrl: a.modelUrl,
      shard: a.shard,
      headers: modelHeaders(a.modelUrl, this.o.base, this.o.secret, this.core.peerId),
      cache,
      onProgress: (p) => {
        if (standby) return;
        this.update({ progress: p });
        if (due(p.doneBytes, p.totalBytes)) this.telemetry('loading', { load: p });
      },
      peers: (this.o.peerShards === false ? [] : (a.sources ?? [])).map((id) => ({ peerId: id, fetch: (names) => this.exchange.fetch(id, names) })),
      onMismatch: (e) => this.o.log(`hash mismatch: ${e.message}`),
      onCacheError: (e) => this.o.log(`shard cache: ${e.code} ${e.message}`),
    });
    const { tensors, cacheError, ...facts } = slice;
    const loaded = { ...facts, cacheError: cacheError ? `${cacheError.code}: ${cacheError.message}` : null };
    if (!standby) state.load = loaded;
    if (cache) await this.cacheChecked(slice);
    const backend = ctx.keep(await this.o.backend(), (b) => b.dispose());
    await backend.load(sliceSource(await model.header(), model.manifest, tensors, a.modelUrl), a.shard);
    // a device lost later (a GPU reset, a crashed GPU process) ends this stage: hand it on with a lower budget
    backend.deviceLost?.().then(
      (why) => ctx.current && this.deviceLost(a, why),
      () => undefined,
    );
    if (standby) this.update({ standby: { shard: { ...a.shard }, load: loaded } });
    return { backend, bytesRead: slice.fetchedBytes, detail: `${slice.fetchedBytes} bytes fetched, ${slice.cachedBytes} from cache` };
  }

  /** The device of a loaded stage (or standby) was lost: the stage fails, and the server hears the lowered budget. */
  private deviceLost(a: LoadContext['assignment'], why: string): void {
    const message = `the WebGPU device was lost (${why}) holding layers ${a.shard.start}-${a.shard.end}`;
    this.o.log(message);
    if (a.t !== 'standby') this.update({ status: 'failed', error: { code: 'WEBGPU_DEVICE_LOST', message } });
    void this.lowerBudget(a, 'WEBGPU_DEVICE_LOST', message);
  }

  /** After a shard did not fit (or its device was lost): below it and at most half, told to the server, which plans with it. */
  private async lowerBudget(a: LoadContext['assignment'], code: string, message: string): Promise<void> {
    const caps = this.o.state.capabilities;
    if (!caps) return;
    const failed = shardBytes(await this.o.model.header(), a.shard, a.nLayer);
    caps.memoryBytes = budgetAfterFailure(caps.memoryBytes, failed);
    this.o.changed();
    this.o.log(`memory budget lowered to ${caps.memoryBytes} bytes after ${code} on a ${failed}-byte shard`);
    this.o.control.sendJson({ t: 'memory', memoryBytes: caps.memoryBytes, code, message, routeId: a.routeId, stage: a.stage });
  }

  /** After a load: units advertised as held but fetched were evicted (said, and held again now); the cache's units and the storage estimate refreshed. */
  private async cacheChecked(slice: LoadedSlice): Promise<void> {
    const { state, cache, model } = this.o;
    const evicted = evictedUnits(state.heldUnits, slice.fetchedUnits);
    if (evicted.length) this.o.log(`the browser evicted cached units ${evicted.join(', ')}: fetched and verified again`);
    state.heldUnits = await cache!.heldUnits(model.manifest.artifact.sha256).catch(() => state.heldUnits);
    if (state.storage) state.storage = { ...state.storage, ...(await storageEstimate()), evictedUnits: [...new Set([...state.storage.evictedUnits, ...evicted])] };
  }

  /** PeerCore's `linkNext`: a data channel to the next browser stage; the relay to a native one, or when none opens. */
  private async connectNext(a: NextStage, ctx: LoadContext): Promise<NextLink> {
    const last = a.shard.end >= a.nLayer;
    if (!last && !a.downstreamPeer) throw new MeshError('STAGE_UNREACHABLE', `stage ${a.stage}: the server named no next stage`);
    // a rewire replaces the downstream link: only the newest one's changes are the stage's
    const seq = ++this.downstreamSeq;
    const hop = await this.hops.connectDownstream(last ? null : a.downstreamPeer!, Boolean(a.downstream) && !a.downstreamRtc, (h) => {
      if (!ctx.current || seq !== this.downstreamSeq) return;
      this.update({ hop: h.kind, relayed: h.relayed, candidatePair: h.candidatePair });
      this.fullTelemetry();
    });
    const { state } = this.o;
    Object.assign(state, { hop: hop.kind, downstreamChannel: hop.channel, relayed: hop.relayed, candidatePair: hop.candidatePair });
    if (state.status === 'ready') this.fullTelemetry(); // a rewire of a serving stage
    if (hop.link) ctx.keep(hop.link, (l) => l.close());
    return { link: hop.link, detail: `hop ${hop.kind}` };
  }

  /** A graceful leave (the page's Leave button): the server moves this tab's stage and sessions first. */
  async leave(timeoutMs = 40_000): Promise<boolean> {
    return this.core.leave(timeoutMs);
  }

  private ready(a: Assignment): void {
    const { state } = this.o;
    // a spare taking over from its standby shard loaded nothing now: its standby load is the stage's
    if (state.standby) this.update({ routeId: a.routeId, stage: a.stage, shard: { ...a.shard }, load: state.standby.load, progress: null, error: null });
    this.update({ status: 'ready', standby: null });
    this.telemetry('ready', { cache: { hit: state.load!.cachedUnits, fetched: state.load!.fetchedUnits, error: state.load!.cacheError }, ...(state.hop ? { hop: state.hop } : {}), candidatePair: state.candidatePair });
  }

  private telemetry(phase: PeerTelemetry['phase'], extra: Partial<PeerTelemetry> = {}): void {
    const { state } = this.o;
    if (state.routeId === null || state.stage === null) return;
    this.o.control.sendJson({ t: 'telemetry', routeId: state.routeId, stage: state.stage, phase, ...extra } satisfies PeerTelemetry);
  }

  /** The stage's phase, hop and frame counters (sent every few seconds while serving). */
  fullTelemetry(): void {
    const { state } = this.o;
    this.telemetry(state.status === 'ready' ? 'ready' : state.status === 'failed' ? 'failed' : 'loading', {
      ...(state.hop ? { hop: state.hop } : {}),
      candidatePair: state.candidatePair,
      downstreamChannel: state.downstreamChannel,
      upstreamChannels: state.upstreamChannels,
      ...(state.relayed ? { relayed: state.relayed } : {}),
    });
  }

  /** ICE servers the signaling server announced, for stage hops and shard channels. */
  useIceServers(servers: RTCIceServer[]): void {
    this.hops.useIceServers(servers);
    this.iceServers ??= servers;
  }

  /** Releases the stage (a load in flight is discarded) and closes every channel. */
  async close(): Promise<void> {
    this.exchange.close();
    await this.core.close();
    await this.hops.close();
  }
}
