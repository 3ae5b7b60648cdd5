// A browser peer: opened from a room link, it proves the room secret, advertises its WebGPU
// adapter (or the CPU engine, where the tab has no WebGPU), memory budget and the shard units
// it already holds verified, and serves the stage the server assigns (browser-stage.ts) —
// loading only that shard's slice, computing in a worker (WebGPU, or WebAssembly SIMD), and
// passing hidden states to the next stage over a WebRTC data channel, or through the server
// when no channel opens in time.

import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import { backendCapability } from '../backends/capabilities.ts';
import type { Manifest } from '../gguf/verify.ts';
import { parseJoinUrl } from '../protocol/control.ts';
import { ShardCache } from '../storage/shard-cache.ts';
import { indexedDbStore } from '../storage/kv-store.ts';
import { opfsStore } from '../storage/opfs-store.ts';
import { requestPersistence } from '../storage/persistence.ts';
import { BrowserStage, joiningState } from './browser-stage.ts';
import type { BrowserPeerState } from './browser-stage.ts';
import { detectCapabilities } from './capabilities.ts';
import type { BrowserCapabilities, ComputePreference } from './capabilities.ts';
import { openControlSocket } from './control-socket.ts';
import type { ControlSocket } from './control-socket.ts';
import type { HelloOffer } from './peer-core.ts';
import { rejoin } from './reconnect.ts';
import type { ReconnectOptions } from './reconnect.ts';
import { fetchRoomModel } from './peer-core.ts';

export type { BrowserPeerState, PeerStatus } from './browser-stage.ts';

export interface BrowserPeerOptions {
  /** the room link: http(s)://server/room/<id>#secret=… */
  joinUrl: string;
  /** the secret, when the link carries none */
  secret?: string;
  name?: string;
  /** bytes offered for weights (default: measured, memory-probe.ts) */
  memoryBytes?: number;
  /** the most the memory probe tries (default: defaultProbeCap) */
  probeCapBytes?: number;
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
  /** 'auto' (default): WebGPU where the tab has an adapter, else the CPU engine; or force one */
  compute?: ComputePreference;
  /** load shard bytes from peers the server names as holding them (default true; false: the server's hosting only) */
  peerShards?: boolean;
  /** the stage backend (default: WebGPU or the CPU engine in a dedicated worker) */
  backend?: () => Promise<StageBackend>;
  /** how often a serving peer reports its frame counters to the server (ms, default 2000) */
  telemetryMs?: number;
  log?: (line: string) => void;
  /** every state change */
  onState?: (s: BrowserPeerState) => void;
  /** rejoin after the control connection drops (default: for 10 minutes, with back-off); false: stay closed */
  reconnect?: false | ReconnectOptions;
}

export interface BrowserPeer {
  readonly state: BrowserPeerState;
  /** a graceful leave: the server hands this tab's stage and its sessions to a replacement, then the tab closes; resolves with whether they moved */
  leave(timeoutMs?: number): Promise<boolean>;
  close(): Promise<void>;
}

/** The shard cache (`opts.cache`, else one over the chosen storage) and the units it holds for the artifact. */
async function openShardCache(opts: BrowserPeerOptions, manifest: Manifest, log: (line: string) => void): Promise<{ cache: ShardCache | null; held: string[] }> {
  let cache: ShardCache | null = null;
  if (opts.cache !== undefined) cache = opts.cache;
  else {
    try {
      cache = new ShardCache(opts.storage === 'opfs' ? await opfsStore() : indexedDbStore());
    } catch (e) {
      log(`no shard cache: ${(e as Error).message}`);
    }
  }
  if (!cache) return { cache, held: [] };
  try {
    return { cache, held: await cache.heldUnits(manifest.artifact.sha256) };
  } catch (e) {
    log(`shard cache unreadable: ${(e as Error).message}`);
    return { cache, held: [] };
  }
}

export async function startBrowserPeer(opts: BrowserPeerOptions): Promise<BrowserPeer> {
  const log = opts.log ?? (() => undefined);
  const { base, roomId, secret: fromLink } = parseJoinUrl(opts.joinUrl);
  const secret = opts.secret ?? fromLink;
  if (!secret) throw new MeshError('AUTH_FAILED', 'the room link carries no secret (#secret=…)');
  const state = joiningState(roomId);
  const changed = (): void => opts.onState?.(state);

  const caps = await detectCapabilities({
    ...(opts.memoryBytes !== undefined ? { memoryBytes: opts.memoryBytes } : {}),
    ...(opts.probeCapBytes ? { probeCapBytes: opts.probeCapBytes } : {}),
    ...(opts.compute ? { prefer: opts.compute } : {}),
  });
  state.capabilities = caps;
  if (caps.backend === 'none') {
    Object.assign(state, { status: 'client-only', reason: caps.reason });
    log(`joining as a client only: ${caps.reason}`);
    changed();
    return { state, leave: async () => true, close: async () => undefined };
  }

  const conn: { control: ControlSocket; stage: BrowserStage } = await joinOnce(opts, { base, roomId, secret, state, changed, log, caps });
  let closing = false;
  // while serving, the server's route summary gets the frame counters every few seconds
  const telemetryTimer = setInterval(() => state.status === 'ready' && conn.stage.fullTelemetry(), opts.telemetryMs ?? 2000);
  // the control socket dropped: release the stage, rejoin with back-off (the shard cache keeps
  // the verified units, so the planner gives this tab its range back and nothing is fetched)
  void (async () => {
    for (;;) {
      const e = await conn.control.closed;
      await conn.stage.close().catch(() => undefined);
      if (closing) return;
      Object.assign(state, { status: opts.reconnect === false ? 'closed' : 'reconnecting', reason: e.message, routeId: null, stage: null, shard: null, progress: null, hop: null });
      changed();
      if (opts.reconnect === false) break;
      log(`${e.message}; rejoining`);
      try {
        const next = await rejoin(() => joinOnce(opts, { base, roomId, secret, state, changed, log, caps }), opts.reconnect ?? {}, () => closing, log);
        if (!next) return;
        Object.assign(conn, next);
      } catch (err) {
        Object.assign(state, { status: 'closed', reason: `rejoining failed: ${(err as Error).message}` });
        changed();
        break;
      }
    }
    clearInterval(telemetryTimer);
  })();
  const close = async (): Promise<void> => {
    closing = true;
    clearInterval(telemetryTimer);
    conn.control.close();
    await conn.stage.close();
  };
  return {
    state,
    async leave(timeoutMs) {
      closing = true; // a tab that leaves does not rejoin
      const moved = state.stage === null ? true : await conn.stage.leave(timeoutMs);
      await close();
      return moved;
    },
    close,
  };
}

interface JoinContext {
  base: string;
  roomId: string;
  secret: string;
  state: BrowserPeerState;
  changed: () => void;
  log: (line: string) => void;
  /** what the tab can compute with and offers (measured once, before the first join) */
  caps: BrowserCapabilities;
}

/** Reads the room's model, opens the control socket and joins: the tab is idle, waiting for an assignment. */
async function joinOnce(opts: BrowserPeerOptions, j: JoinContext): Promise<{ control: ControlSocket; stage: BrowserStage }> {
  const { base, roomId, secret, state, changed, log } = j;
  // the room's model, its manifest and header (JSON from the server: no model bytes)
  const model = await fetchRoomModel(base, roomId, secret);
  state.artifact = model.manifest.artifact.sha256;
  state.modelBytes = model.manifest.artifact.size;
  const { cache, held } = await openShardCache(opts, model.manifest, log);
  state.heldUnits = held;
  if (cache && cache.store.kind !== 'memory') {
    state.storage = await requestPersistence();
    log(`shard cache storage: ${state.storage.persisted ? 'persistent' : 'may be evicted by the browser'}${state.storage.quotaBytes !== null ? `; ${state.storage.usageBytes} of ${state.storage.quotaBytes} bytes used` : ''}`);
  }
  const control = await openControlSocket(base, roomId, (e) => log(`ignored a control message from the server: ${e.message}`));
  const stage = new BrowserStage({
    base, secret, model, control, cache, state, changed, log,
    backend: opts.backend ?? (j.caps.backend === 'cpu' ? cpuBackend : webGpuBackend),
    ...(opts.iceServers ? { iceServers: opts.iceServers } : {}),
    ...(opts.iceTransportPolicy ? { iceTransportPolicy: opts.iceTransportPolicy } : {}),
    ...(opts.rtcTimeoutMs ? { rtcTimeoutMs: opts.rtcTimeoutMs } : {}),
    ...(opts.peerShards === false ? { peerShards: false } : {}),
  });
  const caps = j.caps;
  if (caps.backend === 'none') throw new MeshError('WEBGPU_UNAVAILABLE', `this tab cannot compute: ${caps.reason}`); // startBrowserPeer joins such a tab as a client only
  if (caps.backend === 'cpu') log(`no WebGPU: ${caps.reason}`);
  const offer = { backend: caps.backend, memoryBytes: caps.memoryBytes, serves: backendCapability(caps.backend), ...(opts.name ? { name: opts.name } : {}), artifact: model.manifest.artifact.sha256, units: state.heldUnits, adapter: caps.adapter };
  try {
    const welcome = await stage.core.join(offer, control.closed);
    // a server on the internet may announce STUN/TURN servers; on a LAN none are needed
    if (Array.isArray(welcome.iceServers)) stage.useIceServers(welcome.iceServers as RTCIceServer[]);
  } catch (e) {
    control.close();
    await stage.close().catch(() => undefined);
    throw e;
  }
  Object.assign(state, { peerId: stage.core.peerId, status: 'idle', reason: null });
  changed();
  log(`joined room ${roomId} as ${state.peerId} (model ${model.id}; holding ${state.heldUnits.length ? state.heldUnits.join(', ') : 'nothing'})`);
  return { control, stage };
}

async function webGpuBackend(): Promise<StageBackend> {
  const { webGpuBackendInWorker } = await import('../../workers/webgpu-stage.ts');
  return webGpuBackendInWorker();
}

async function cpuBackend(): Promise<StageBackend> {
  const { cpuBackendInWorker } = await import('../../workers/cpu-stage.ts');
  return cpuBackendInWorker();
}
