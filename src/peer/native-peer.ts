// A native peer: listens for frames (WebSocket + binary HTTP), joins a room over its control
// WebSocket, and serves the stage it is assigned (peer-core.ts: hello, assign, release; the
// loading itself in native-stage.ts) — reading only that shard's byte ranges from the server —
// with hidden states sent straight to the next stage's listen address, or over a WebRTC data
// channel to and from tabs (native-rtc.ts).

import { join } from 'node:path';
import WebSocket from 'ws';
import { meshCacheDir } from '../cache-dir.ts';
import { MeshError } from '../errors.ts';
import type { ShardRange } from '../backends/types.ts';
import { backendCapability } from '../backends/capabilities.ts';
import type { WebGpuBackend } from '../backends/webgpu/backend.ts';
import { parseJoinUrl } from '../protocol/control.ts';
import type { PeerSpeed, PeerToServer, RelayReply } from '../protocol/control.ts';
import { startFrameServer } from '../transport/frame-server.ts';
import type { FrameServer } from '../transport/frame-server.ts';
import { serveFrames } from '../transport/ws.ts';
import { tlsOptions } from '../transport/tls-trust.ts';
import { linkNativeNext, loadNativeShard, nodeWebGpuBackend } from './native-stage.ts';
import type { BackendKind, NativeStageEnv } from './native-stage.ts';
import { fetchRoomModel, PeerCore } from './peer-core.ts';
import type { HelloOffer, LoadContext, RoomModel, ShardLoad } from './peer-core.ts';
import { calibrate } from './calibrate.ts';
import { delayedHandler, delayedLink, later, slowedBackend } from './test-shaping.ts';
import { hyperParameters } from '../gguf/summary.ts';
import { NativeRtc } from './native-rtc.ts';
import { RelayLink } from './relay-link.ts';
import type { StageService } from './stage-service.ts';
import { heldUnits } from './verified-source.ts';

export type { BackendKind } from './native-stage.ts';

export interface NodePeerOptions {
  joinUrl: string;
  secret: string;
  backend: BackendKind;
  memoryBytes: number;
  layers?: ShardRange;
  listenHost?: string;
  listenPort?: number;
  /** the ws:// address other peers should use, when not the listen address (a proxy, NAT) */
  advertise?: string;
  /** how hidden states go to the next stage: WebSocket (default) or binary HTTP requests */
  carrier?: 'ws' | 'http';
  name?: string;
  /** where verified shards (cpu) and whole model copies (llama.cpp) are kept; null = no cache */
  cacheDir?: string | null;
  /** cpu: threads the engine computes on (default: every core) */
  threads?: number;
  /** WebRTC data channels to and from tabs (default true; off: those hops use the server relay) */
  webrtc?: boolean;
  /** measure this node's speed on one layer of the room's model before joining, where the room plans by speed (default true; cpu and webgpu backends) */
  calibrate?: boolean;
  /** test only (test-shaping.ts): forward passes take this many times as long */
  testSlowFactor?: number;
  /** test only (test-shaping.ts): every frame and control message in and out waits this long (ms) */
  testLinkDelayMs?: number;
  log?: (line: string) => void;
}

export interface NodePeer {
  readonly peerId: string | null;
  server: FrameServer;
  /** current stage, once assigned and loaded */
  readonly service: StageService | null;
  /** resolves when the control connection ends */
  closed: Promise<string>;
  /** a graceful leave: the server moves this peer's stage and sessions to a replacement first; resolves with whether they moved */
  leave(timeoutMs?: number): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * webgpu: a device before joining, so a host without an adapter fails at once
 * (WEBGPU_UNAVAILABLE) instead of at its first assignment, and the room sees the adapter.
 * That first device serves the first assignment; later ones get a fresh device.
 */
async function spareGpuFor(kind: BackendKind, log: (line: string) => void): Promise<WebGpuBackend | null> {
  if (kind !== 'webgpu') return null;
  let gpu: WebGpuBackend;
  try {
    gpu = await nodeWebGpuBackend();
  } catch (e) {
    if ((e as MeshError).code !== 'WEBGPU_UNAVAILABLE') throw e;
    throw new MeshError('WEBGPU_UNAVAILABLE', `--backend webgpu: ${(e as Error).message} (Dawn found no usable GPU here; use --backend cpu)`);
  }
  const a = gpu.adapter;
  log(`webgpu adapter: ${[a.vendor, a.architecture, a.description].filter(Boolean).join(' ') || 'unnamed'}${a.isFallbackAdapter ? ' (software)' : ''}`);
  return gpu;
}

/** The control WebSocket's end: `gone` (for the join: unreachable or closed), `closed` (why, once it closed). */
function watchControl(ws: WebSocket, base: string): { gone: Promise<Error>; closed: Promise<string> } {
  let resolveGone!: (e: Error) => void;
  const gone = new Promise<Error>((r) => (resolveGone = r));
  ws.once('error', (e) => resolveGone(new MeshError('JOIN_FAILED', `cannot reach ${base}: ${e.message}`)));
  const closed = new Promise<string>((resolve) =>
    ws.on('close', (code, reason) => {
      const why = `control connection closed (${code}${reason.length ? ` ${reason.toString()}` : ''})`;
      resolveGone(new MeshError('JOIN_FAILED', why));
      resolve(why);
    }),
  );
  return { gone, closed };
}

/** What the hello offers: the backend, memory, where frames reach this node, what it holds verified. */
function helloOffer(opts: NodePeerOptions, server: FrameServer, has: { artifact: string; units: string[]; adapter: unknown; rtc: boolean; speed: PeerSpeed | null }): HelloOffer {
  return {
    backend: opts.backend,
    memoryBytes: opts.memoryBytes,
    serves: backendCapability(opts.backend),
    listen: opts.advertise ?? server.wsUrl,
    httpUrl: opts.advertise ? opts.advertise.replace(/^ws/, 'http').replace(/\/v1\/frames$/, '') : server.url,
    artifact: has.artifact,
    units: has.units,
    ...(opts.name ? { name: opts.name } : {}),
    ...(opts.layers ? { layers: opts.layers } : {}),
    ...(has.adapter ? { adapter: has.adapter } : {}),
    ...(has.rtc ? { rtc: true } : {}),
    ...(has.speed ? { speed: has.speed } : {}),
  };
}

/** This node's speed on the room's model, or null (not asked, a backend it is not measured on, or it failed: then said in the log). */
async function measureSpeed(opts: NodePeerOptions, model: RoomModel, load: (ctx: LoadContext) => Promise<ShardLoad>, log: (line: string) => void): Promise<PeerSpeed | null> {
  if (opts.calibrate === false || model.planner !== 'speed' || (opts.backend !== 'cpu' && opts.backend !== 'webgpu') || !model.url || !model.nLayer) return null;
  try {
    const speed = await calibrate(load, { modelUrl: model.url, nLayer: model.nLayer, nEmbd: hyperParameters(await model.header()).n_embd });
    log(`speed: ${speed.decodeMsPerLayer.toFixed(3)} ms per layer per decoded token, ${speed.prefillMsPerTokenLayer.toFixed(3)} ms per layer per prefilled token`);
    return speed;
  } catch (e) {
    log(`${(e as MeshError).code ?? 'CALIBRATION_FAILED'}: ${(e as Error).message}`);
    return null;
  }
}

export async function startNodePeer(opts: NodePeerOptions): Promise<NodePeer> {
  const log = opts.log ?? (() => undefined);
  const { base, roomId } = parseJoinUrl(opts.joinUrl);
  const cacheDir = opts.cacheDir === undefined ? join(meshCacheDir(), 'shards') : opts.cacheDir;
  // what the room serves, and the manifest every loaded byte is checked against
  const model = await fetchRoomModel(base, roomId, opts.secret);
  const units = cacheDir ? await heldUnits(cacheDir, model.manifest) : [];
  let spareGpu = await spareGpuFor(opts.backend, log);
  const adapter = spareGpu?.adapter;
  let relay: RelayLink | null = null;
  let rtc: NativeRtc | null = null;
  // the control socket opens once the frame server listens: the hello names its address
  let control: WebSocket | null = null;
  const delay = opts.testLinkDelayMs ?? 0;
  const send = later((m: PeerToServer): void => {
    if (control?.readyState === WebSocket.OPEN) control.send(JSON.stringify(m));
  }, delay);
  const env: NativeStageEnv = {
    backend: opts.backend, memoryBytes: opts.memoryBytes, carrier: opts.carrier ?? 'ws', cacheDir, base, secret: opts.secret, model, send, log,
    ...(opts.threads ? { threads: opts.threads } : {}),
    peerId: () => core.peerId,
    takeSpareGpu: () => {
      const gpu = spareGpu;
      spareGpu = null;
      return gpu;
    },
    // a browser next stage has no listen address: frames go through the server (peer/relay-link.ts)
    relayTo: (to) => (relay = new RelayLink(to, later((r) => control!.send(JSON.stringify(r)), delay))),
    rtc: () => rtc,
  };
  const loadShard = async (ctx: LoadContext): Promise<ShardLoad> => {
    const load = await loadNativeShard(ctx, env);
    return { ...load, backend: slowedBackend(load.backend, opts.testSlowFactor ?? 1) };
  };
  const core = new PeerCore({
    secret: opts.secret, send, log,
    loadShard,
    linkNext: async (next, ctx) => {
      const l = await linkNativeNext(next, ctx, env);
      return l.link ? { ...l, link: delayedLink(l.link, delay) } : l;
    },
    onAssign: (a) => {
      rtc?.released();
      rtc?.setUpstream(a.upstreamPeer ?? null);
    },
    // the room's route summary shows this stage's hop and its candidate pairs
    onReady: (a, _load, link) => rtc?.serving(a.routeId, a.stage, link.hop?.kind ?? 'none', link.hop?.candidatePair ?? null),
    onRelease: () => rtc?.released(),
  });
  const handle = delayedHandler(core.handle, delay);
  const speed = await measureSpeed(opts, model, loadShard, log);
  const server = await startFrameServer({
    host: opts.listenHost ?? '127.0.0.1',
    port: opts.listenPort ?? 0,
    secret: opts.secret,
    handler: handle,
    status: () => ({ peerId: core.peerId, backend: opts.backend, memoryBytes: opts.memoryBytes, routeId: core.routeId, ...(core.service ? core.service.status() : {}) }),
  });

  // data channels to and from tabs (./native-rtc.ts); null where WebRTC is off or will not load
  // (loaded before the control socket opens: its challenge must find the listener below)
  rtc = opts.webrtc === false ? null : await NativeRtc.start({ sendJson: (m) => send(m as PeerToServer), handler: handle, log });
  // (a test's link delay answers the server's heartbeat late too: its round trip is the planner's link)
  const ws = (control = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`, { ...tlsOptions(), ...(delay > 0 ? { autoPong: false } : {}) })); // a pinned local CA (tls-trust.ts)
  if (delay > 0) ws.on('ping', (data) => setTimeout(() => ws.readyState === WebSocket.OPEN && ws.pong(data), 2 * delay));
  serveFrames(ws, handle);
  const { gone, closed } = watchControl(ws, base);
  ws.on('message', later((data: WebSocket.RawData, isBinary: boolean) => {
    if (isBinary) return; // frames: serveFrames answers them
    const m = JSON.parse(data.toString()) as { t: string };
    if (core.onMessage(m)) return;
    // a relay reply is for this node's own relay link, else for the relay WebRTC fell back to
    if (m.t === 'relay-reply' && relay?.deliver(m as RelayReply)) return;
    rtc?.onControl(m);
  }, delay));
  const joining = core.join(helloOffer(opts, server, { artifact: model.manifest.artifact.sha256, units, adapter, rtc: rtc !== null, speed }), gone);
  try {
    const w = await joining;
    if (w.iceServers?.length) rtc?.useIceServers(w.iceServers);
    log(`joined room ${w.roomId} as ${w.peerId} (model ${w.model.id}, ${w.model.nLayer} layers); listening at ${server.url}`);
  } catch (e) {
    ws.terminate();
    await rtc?.close();
    await spareGpu?.dispose();
    await server.close();
    throw e;
  }
  return {
    get peerId() {
      return core.peerId;
    },
    server,
    get service() {
      return core.service;
    },
    closed,
    leave: (timeoutMs = 40_000) => core.leave(timeoutMs),
    async close() {
      ws.close();
      await core.close();
      await rtc?.close();
      await spareGpu?.dispose();
      spareGpu = null;
      await server.close();
    },
  };
}
