// A browser peer: opened from a room link, it proves the room secret, advertises its WebGPU
// adapter, memory budget and the shard units it already holds verified, and serves the stage
// the server assigns — loading only that shard's slice (cache first, then HTTP Range, every
// tensor verified), computing in the WebGPU worker, and passing hidden states to the next
// stage over a WebRTC data channel, or through the server when no channel opens in time.

import { MeshError } from '../errors.ts';
import type { Manifest } from '../gguf/verify.ts';
import type { GgufHeader } from '../gguf/types.ts';
import { parseManifest } from '../gguf/verify.ts';
import type { ShardRange, StageBackend } from '../backends/types.ts';
import { Sampler } from '../model/sampler.ts';
import { StageService } from './stage-service.ts';
import type { SamplerFactory } from './stage-service.ts';
import type { FrameHandler, FrameLink } from '../transport/link.ts';
import { servePipe } from '../transport/webrtc-link.ts';
import type { PipeCounters } from '../protocol/control.ts';
import { ShardCache } from '../storage/shard-cache.ts';
import { indexedDbStore } from '../storage/kv-store.ts';
import { opfsStore } from '../storage/opfs-store.ts';
import { detectCapabilities } from './capabilities.ts';
import type { BrowserCapabilities } from './capabilities.ts';
import { openControlSocket } from './control-socket.ts';
import { helloProof, parseJoinUrl } from '../protocol/control.ts';
import type { ControlSocket } from './control-socket.ts';
import { headerFromWire } from '../protocol/header-wire.ts';
import type { HopKind, PeerTelemetry, RelayReply, SignalFromPeer } from '../protocol/control.ts';
import { Hops } from './hops.ts';
import { backendCapability } from '../backends/capabilities.ts';
import { loadSlice, sliceSource } from './slice-loader.ts';
import type { LoadedSlice, SliceProgress } from './slice-loader.ts';

export interface BrowserPeerOptions {
  /** the room link: http(s)://server/room/<id>#secret=… */
  joinUrl: string;
  /** the secret, when the link carries none */
  secret?: string;
  name?: string;
  /** bytes offered for weights (default: from the adapter and navigator.deviceMemory) */
  memoryBytes?: number;
  /** shard cache (default: one over `storage`); null disables caching */
  cache?: ShardCache | null;
  /** where the default cache keeps slices: IndexedDB (default) or the Origin Private File
   *  System, for slices larger than IndexedDB holds comfortably */
  storage?: 'indexeddb' | 'opfs';
  iceServers?: RTCIceServer[];
  /** 'relay' lets no direct candidate through: with no TURN server every hop falls back to the server relay */
  iceTransportPolicy?: RTCIceTransportPolicy;
  /** how long to wait for a data channel before relaying (ms, default 10 s) */
  rtcTimeoutMs?: number;
  /** the stage backend (default: WebGPU in a dedicated worker) */
  backend?: () => Promise<StageBackend>;
  /** how often a serving peer reports its frame counters to the server (ms, default 2000) */
  telemetryMs?: number;
  log?: (line: string) => void;
  /** every state change */
  onState?: (s: BrowserPeerState) => void;
}

export type PeerStatus = 'joining' | 'idle' | 'loading' | 'ready' | 'failed' | 'client-only' | 'closed';

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

export interface BrowserPeer {
  readonly state: BrowserPeerState;
  close(): Promise<void>;
}

interface Assignment {
  routeId: number;
  stage: number;
  shard: ShardRange;
  nLayer: number;
  modelUrl: string;
  downstream: string | null;
  downstreamPeer?: string | null;
  upstreamPeer?: string | null;
}

interface Current {
  routeId: number;
  stage: number;
  backend: StageBackend;
  service: StageService;
  downstream: FrameLink | null;
}

const stageSampler: SamplerFactory = (settings) => {
  const sampler = new Sampler(settings);
  return (logits) => sampler.sample(logits, []);
};

async function getJson<T>(url: string, secret: string): Promise<T> {
  const res = await fetch(url, { headers: { authorization: `Bearer ${secret}` } });
  const body = (await res.json().catch(() => ({}))) as T & { error?: { code: string; message: string } };
  if (!res.ok) throw new MeshError(body.error?.code ?? 'HTTP_ERROR', body.error?.message ?? `${url}: HTTP ${res.status}`);
  return body;
}

export async function startBrowserPeer(opts: BrowserPeerOptions): Promise<BrowserPeer> {
  const log = opts.log ?? (() => undefined);
  const { base, roomId, secret: fromLink } = parseJoinUrl(opts.joinUrl);
  const secret = opts.secret ?? fromLink;
  if (!secret) throw new MeshError('AUTH_FAILED', 'the room link carries no secret (#secret=…)');

  const state: BrowserPeerState = {
    status: 'joining', reason: null, peerId: null, roomId, capabilities: null, artifact: null, heldUnits: [],
    routeId: null, stage: null, shard: null, progress: null, load: null, error: null,
    hop: null, downstreamChannel: null, upstreamChannels: {}, relayed: null,
  };
  const changed = (): void => opts.onState?.(state);

  const caps = await detectCapabilities(opts.memoryBytes);
  state.capabilities = caps;
  if (caps.backend === 'none') {
    state.status = 'client-only';
    state.reason = caps.reason;
    log(`joining as a client only: ${caps.reason}`);
    changed();
    return { state, close: async () => undefined };
  }

  // the room's model, its manifest and header (JSON from the server: no model bytes)
  const room = await getJson<{ model: { id: string } }>(`${base}/v1/rooms/${roomId}`, secret);
  const modelId = room.model.id;
  const manifest: Manifest = parseManifest(await getJson<unknown>(`${base}/v1/models/${encodeURIComponent(modelId)}/manifest`, secret));
  let header: GgufHeader | null = null;
  const headerOnce = async (): Promise<GgufHeader> => (header ??= headerFromWire(await getJson<unknown>(`${base}/v1/models/${encodeURIComponent(modelId)}/header`, secret)));
  state.artifact = manifest.artifact.sha256;

  let cache: ShardCache | null = null;
  if (opts.cache !== undefined) cache = opts.cache;
  else {
    try {
      cache = new ShardCache(opts.storage === 'opfs' ? await opfsStore() : indexedDbStore());
    } catch (e) {
      log(`no shard cache: ${(e as Error).message}`);
    }
  }
  if (cache) {
    try {
      state.heldUnits = await cache.heldUnits(manifest.artifact.sha256);
    } catch (e) {
      log(`shard cache unreadable: ${(e as Error).message}`);
    }
  }

  const control: ControlSocket = await openControlSocket(base, roomId);
  let current: Current | null = null;
  let assignSeq = 0;

  const handler: FrameHandler = async (f) => {
    if (!current) throw new MeshError('STAGE_NOT_LOADED', 'this peer serves no stage yet');
    return current.service.handle(f);
  };
  servePipe(control.frames, handler, { smallMessageBytes: control.frames.maxMessageSize });
  let upstreamPeer: string | null = null;
  const hops = new Hops({
    sendJson: (m) => control.sendJson(m),
    handler,
    acceptFrom: (id) => id === upstreamPeer,
    ...(opts.iceServers ? { iceServers: opts.iceServers } : {}),
    ...(opts.iceTransportPolicy ? { iceTransportPolicy: opts.iceTransportPolicy } : {}),
    ...(opts.rtcTimeoutMs ? { timeoutMs: opts.rtcTimeoutMs } : {}),
    log,
  });
  state.upstreamChannels = hops.upstreamChannels;

  const telemetry = (phase: PeerTelemetry['phase'], extra: Partial<PeerTelemetry> = {}): void => {
    if (state.routeId === null || state.stage === null) return;
    control.sendJson({ t: 'telemetry', routeId: state.routeId, stage: state.stage, phase, ...extra } satisfies PeerTelemetry);
  };
  const fullTelemetry = (): void => {
    telemetry(state.status === 'ready' ? 'ready' : state.status === 'failed' ? 'failed' : 'loading', {
      ...(state.hop ? { hop: state.hop } : {}),
      downstreamChannel: state.downstreamChannel,
      upstreamChannels: state.upstreamChannels,
      ...(state.relayed ? { relayed: state.relayed } : {}),
    });
  };

  const release = async (): Promise<void> => {
    const c = current;
    current = null;
    if (!c) return;
    await c.service.releaseAll();
    await c.downstream?.close();
    await c.backend.dispose();
  };

  const assign = async (a: Assignment): Promise<void> => {
    const mySeq = ++assignSeq;
    const t0 = performance.now();
    upstreamPeer = a.upstreamPeer ?? null; // the only peer whose data channel this stage answers
    await release();
    Object.assign(state, { status: 'loading', routeId: a.routeId, stage: a.stage, shard: { ...a.shard }, progress: null, load: null, error: null, hop: null, downstreamChannel: null, relayed: null });
    changed();
    let backend: StageBackend | null = null;
    try {
      let lastSent = 0;
      const slice = await loadSlice({
        manifest,
        modelUrl: a.modelUrl,
        shard: a.shard,
        headers: modelHeaders(a.modelUrl, base, secret, state.peerId),
        cache,
        onProgress: (p) => {
          state.progress = p;
          changed();
          if (performance.now() - lastSent > 250 || p.doneBytes === p.totalBytes) {
            lastSent = performance.now();
            telemetry('loading', { load: p });
          }
        },
        onMismatch: (e) => log(`hash mismatch: ${e.message}`),
        onCacheError: (e) => log(`shard cache: ${e.code} ${e.message}`),
      });
      const { tensors, cacheError, ...facts } = slice;
      state.load = { ...facts, cacheError: cacheError ? `${cacheError.code}: ${cacheError.message}` : null };
      if (cache) state.heldUnits = await cache.heldUnits(manifest.artifact.sha256).catch(() => state.heldUnits);
      backend = await (opts.backend ?? defaultBackend)();
      await backend.load(sliceSource(await headerOnce(), manifest, tensors, a.modelUrl), a.shard);
      if (a.shard.end < a.nLayer && !a.downstreamPeer) throw new MeshError('STAGE_UNREACHABLE', `stage ${a.stage}: the server named no next stage`);
      const hop = await hops.connectDownstream(a.shard.end < a.nLayer ? a.downstreamPeer! : null, Boolean(a.downstream), (h) => {
        if (mySeq !== assignSeq) return;
        Object.assign(state, { hop: h.kind, relayed: h.relayed });
        changed();
        fullTelemetry();
      });
      Object.assign(state, { hop: hop.kind, downstreamChannel: hop.channel, relayed: hop.relayed });
      const downstream = hop.link;
      if (mySeq !== assignSeq) {
        await downstream?.close();
        await backend.dispose();
        return;
      }
      const service = new StageService({ backend, stage: a.stage, shard: a.shard, nLayer: a.nLayer, downstream, samplerFactory: stageSampler });
      current = { routeId: a.routeId, stage: a.stage, backend, service, downstream };
      state.status = 'ready';
      changed();
      log(`stage ${a.stage} of route ${a.routeId}: layers ${a.shard.start}-${a.shard.end} ready (${slice.fetchedBytes} bytes fetched, ${slice.cachedBytes} from cache, hop ${state.hop})`);
      control.sendJson({ t: 'ready', routeId: a.routeId, stage: a.stage, loadMs: performance.now() - t0, bytesRead: slice.fetchedBytes });
      telemetry('ready', { cache: { hit: slice.cachedUnits, fetched: slice.fetchedUnits, error: state.load.cacheError }, ...(state.hop ? { hop: state.hop } : {}) });
    } catch (e) {
      await backend?.dispose().catch(() => undefined);
      if (mySeq !== assignSeq) return; // released or superseded meanwhile
      const err = e instanceof MeshError ? e : new MeshError('LOAD_FAILED', (e as Error).message);
      Object.assign(state, { status: 'failed', error: { code: err.code, message: err.message } });
      changed();
      log(`stage ${a.stage} of route ${a.routeId}: load failed: ${err.code} ${err.message}`);
      control.sendJson({ t: 'load-failed', routeId: a.routeId, stage: a.stage, code: err.code, message: err.message });
    }
  };

  control.onJson((m) => {
    if (m.t === 'assign') void assign(m as unknown as Assignment);
    else if (m.t === 'release') {
      if (state.routeId === m.routeId) {
        assignSeq++; // a load still in flight for this route is discarded when it finishes
        void release();
        Object.assign(state, { status: 'idle', routeId: null, stage: null, shard: null, hop: null });
        changed();
      }
    } else if (m.t === 'signal') hops.onSignal(m as unknown as SignalFromPeer);
    else if (m.t === 'relay-reply') hops.onRelayReply(m as unknown as RelayReply);
  });

  // challenge → hello → welcome
  await new Promise<void>((resolve, reject) => {
    control.onJson(async (m) => {
      if (m.t === 'challenge') {
        control.sendJson({
          t: 'hello',
          proof: await helloProof(secret, String(m.nonce)),
          backend: 'webgpu',
          memoryBytes: caps.memoryBytes,
          ...(caps.backend === 'webgpu' ? { serves: backendCapability('webgpu') } : {}),
          ...(opts.name ? { name: opts.name } : {}),
          artifact: manifest.artifact.sha256,
          units: state.heldUnits,
          adapter: caps.adapter,
        });
      } else if (m.t === 'welcome') {
        // a server on the internet may announce STUN/TURN servers; on a LAN none are needed
        if (Array.isArray(m.iceServers)) hops.useIceServers(m.iceServers as RTCIceServer[]);
        state.peerId = String(m.peerId);
        state.status = 'idle';
        changed();
        log(`joined room ${roomId} as ${state.peerId} (model ${modelId}; holding ${state.heldUnits.length ? state.heldUnits.join(', ') : 'nothing'})`);
        resolve();
      } else if (m.t === 'error') {
        reject(new MeshError(String(m.code), String(m.message)));
      }
    });
    void control.closed.then(reject);
  });
  // while serving, the server's route summary gets the frame counters every few seconds
  const telemetryTimer = setInterval(() => state.status === 'ready' && fullTelemetry(), opts.telemetryMs ?? 2000);
  void control.closed.then((e) => {
    clearInterval(telemetryTimer);
    Object.assign(state, { status: 'closed', reason: e.message });
    changed();
    void release().then(() => hops.close());
  });

  return {
    state,
    async close() {
      clearInterval(telemetryTimer);
      assignSeq++; // discard a load in flight
      control.close();
      await release();
      await hops.close();
    },
  };
}

/**
 * Headers for reading the model: the room secret and peer id go only to the signaling server's
 * own model hosting. A third-party URL (a model hub) gets none — the secret must not leak, and
 * custom headers would make its CORS preflight fail.
 */
export function modelHeaders(modelUrl: string, serverBase: string, secret: string, peerId: string | null): Record<string, string> {
  if (new URL(modelUrl).origin !== new URL(serverBase).origin) return {};
  return { authorization: `Bearer ${secret}`, 'x-mesh-peer': peerId ?? 'unknown' };
}

async function defaultBackend(): Promise<StageBackend> {
  const { webGpuBackendInWorker } = await import('../../workers/webgpu-stage.ts');
  return webGpuBackendInWorker();
}
