// A tab's stage, once it has joined: PeerCore takes the server's assignments; this side loads
// the assigned slice (cache first, then HTTP Range, every tensor verified) into the backend
// (the WebGPU worker by default), links the stage to its neighbours over WebRTC data channels
// or the server relay (hops.ts), keeps the state the page shows, and reports telemetry.

import { MeshError } from '../errors.ts';
import type { ShardRange, StageBackend } from '../backends/types.ts';
import type { HopKind, PeerTelemetry, PipeCounters } from '../protocol/control.ts';
import { servePipe } from '../transport/webrtc-link.ts';
import type { ShardCache } from '../storage/shard-cache.ts';
import type { BrowserCapabilities } from './capabilities.ts';
import type { ControlSocket } from './control-socket.ts';
import { Hops } from './hops.ts';
import { modelHeaders, PeerCore, progressGate } from './peer-core.ts';
import type { Assignment, LoadContext, RoomModel, StageLoad } from './peer-core.ts';
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
  heldUnits: string[];
  routeId: number | null;
  stage: number | null;
  shard: ShardRange | null;
  progress: SliceProgress | null;
  load: Omit<LoadedSlice, 'tensors' | 'cacheError'> & { cacheError: string | null } | null;
  error: { code: string; message: string } | null;
  hop: HopKind | null;
  downstreamChannel: PipeCounters | null;
  upstreamChannels: Record<string, PipeCounters>;
  relayed: { frames: number; bytes: number } | null;
}

export function joiningState(roomId: string): BrowserPeerState {
  return {
    status: 'joining', reason: null, peerId: null, roomId, capabilities: null, artifact: null, heldUnits: [],
    routeId: null, stage: null, shard: null, progress: null, load: null, error: null,
    hop: null, downstreamChannel: null, upstreamChannels: {}, relayed: null,
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
  log: (line: string) => void;
}

export class BrowserStage {
  readonly core: PeerCore;
  readonly hops: Hops;
  /** the only peer whose data channel this stage answers: the assigned previous stage */
  private upstreamPeer: string | null = null;

  constructor(private readonly o: BrowserStageOptions) {
    const { control, state } = o;
    this.core = new PeerCore({
      secret: o.secret,
      send: (m) => control.sendJson(m),
      log: o.log,
      loadStage: (ctx) => this.load(ctx),
      onAssign: (a) => (this.upstreamPeer = a.upstreamPeer ?? null),
      onReady: () => this.ready(),
      onFailed: (_a, err) => this.update({ status: 'failed', error: { code: err.code, message: err.message } }),
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
    control.onJson((m) => {
      if (this.core.onMessage(m)) return;
      if (m.t === 'signal') this.hops.onSignal(m);
      else if (m.t === 'relay-reply') this.hops.onRelayReply(m);
    });
  }

  private update(s: Partial<BrowserPeerState>): void {
    Object.assign(this.o.state, s);
    this.o.changed();
  }

  /** PeerCore's `loadStage`: the slice, the backend, then the hop to the next stage. */
  private async load(ctx: LoadContext): Promise<StageLoad> {
    const { state, cache, model } = this.o;
    const a = ctx.assignment;
    this.update({ status: 'loading', routeId: a.routeId, stage: a.stage, shard: { ...a.shard }, progress: null, load: null, error: null, hop: null, downstreamChannel: null, relayed: null });
    const due = progressGate(250);
    const slice = await loadSlice({
      manifest: model.manifest,
      modelUrl: a.modelUrl,
      shard: a.shard,
      headers: modelHeaders(a.modelUrl, this.o.base, this.o.secret, this.core.peerId),
      cache,
      onProgress: (p) => {
        this.update({ progress: p });
        if (due(p.doneBytes, p.totalBytes)) this.telemetry('loading', { load: p });
      },
      onMismatch: (e) => this.o.log(`hash mismatch: ${e.message}`),
      onCacheError: (e) => this.o.log(`shard cache: ${e.code} ${e.message}`),
    });
    const { tensors, cacheError, ...facts } = slice;
    state.load = { ...facts, cacheError: cacheError ? `${cacheError.code}: ${cacheError.message}` : null };
    if (cache) state.heldUnits = await cache.heldUnits(model.manifest.artifact.sha256).catch(() => state.heldUnits);
    const backend = ctx.keep(await this.o.backend(), (b) => b.dispose());
    await backend.load(sliceSource(await model.header(), model.manifest, tensors, a.modelUrl), a.shard);
    const hop = await this.connectNext(ctx);
    Object.assign(state, { hop: hop.kind, downstreamChannel: hop.channel, relayed: hop.relayed });
    if (hop.link) ctx.keep(hop.link, (l) => l.close());
    return { backend, downstream: hop.link, bytesRead: slice.fetchedBytes, detail: `${slice.fetchedBytes} bytes fetched, ${slice.cachedBytes} from cache, hop ${hop.kind}` };
  }

  /** A data channel to the next browser stage; the relay to a native one, or when none opens. */
  private connectNext(ctx: LoadContext): ReturnType<Hops['connectDownstream']> {
    const a: Assignment = ctx.assignment;
    const last = a.shard.end >= a.nLayer;
    if (!last && !a.downstreamPeer) throw new MeshError('STAGE_UNREACHABLE', `stage ${a.stage}: the server named no next stage`);
    return this.hops.connectDownstream(last ? null : a.downstreamPeer!, Boolean(a.downstream), (h) => {
      if (!ctx.current) return;
      this.update({ hop: h.kind, relayed: h.relayed });
      this.fullTelemetry();
    });
  }

  private ready(): void {
    const { state } = this.o;
    this.update({ status: 'ready' });
    this.telemetry('ready', { cache: { hit: state.load!.cachedUnits, fetched: state.load!.fetchedUnits, error: state.load!.cacheError }, ...(state.hop ? { hop: state.hop } : {}) });
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
      downstreamChannel: state.downstreamChannel,
      upstreamChannels: state.upstreamChannels,
      ...(state.relayed ? { relayed: state.relayed } : {}),
    });
  }

  /** Releases the stage (a load in flight is discarded) and closes every channel. */
  async close(): Promise<void> {
    await this.core.close();
    await this.hops.close();
  }
}
