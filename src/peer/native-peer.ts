// A native peer: listens for frames (WebSocket + binary HTTP), joins a room over its control
// WebSocket, and serves the stage it is assigned (peer-core.ts: hello, assign, release; the
// loading itself in native-stage.ts) — reading only that shard's byte ranges from the server —
// with hidden states sent straight to the next stage's listen address, or over a WebRTC data
// channel to and from tabs (native-rtc.ts). When the control connection drops (the server
// restarted, the network blinked) it joins again with back-off, advertising the shards its cache
// holds verified, so the planner (or a repair) gives it the same range back without a download.

import { join } from 'node:path';
import WebSocket from 'ws';
import { meshCacheDir } from '../cache-dir.ts';
import { MeshError } from '../errors.ts';
import type { ShardRange } from '../backends/types.ts';
import { backendCapability } from '../backends/capabilities.ts';
import type { WebGpuBackend } from '../backends/webgpu/backend.ts';
import { parseJoinUrl, parseServerMessage } from '../protocol/control.ts';
import type { PeerSpeed, PeerToServer, ServerMessage } from '../protocol/control.ts';
import { startFrameServer } from '../transport/frame-server.ts';
import type { FrameServer } from '../transport/frame-server.ts';
import { serveFrames } from '../transport/ws.ts';
import { tlsOptions } from '../transport/tls-trust.ts';
import { linkNativeNext, loadNativeShard, nodeWebGpuBackend } from './native-stage.ts';
import type { BackendKind, NativeStageEnv } from './native-stage.ts';
import { fetchRoomModel, PeerCore } from './peer-core.ts';
import type { HelloOffer, LoadContext, RoomModel, ShardLoad, StageLimits } from './peer-core.ts';
import { calibrate } from './calibrate.ts';
import { delayedHandler, delayedLink, later, slowedBackend } from './test-shaping.ts';
import type { PassCount } from './test-shaping.ts';
import { hyperParameters } from '../gguf/summary.ts';
import { NativeRtc } from './native-rtc.ts';
import { rejoin } from './reconnect.ts';
import type { ReconnectOptions } from './reconnect.ts';
import type { FrameHandler } from '../transport/link.ts';
import { RelayLink } from './relay-link.ts';
import type { StageService } from './stage-service.ts';
import { UpstreamFence } from './upstream-fence.ts';
import { heldUnits } from './verified-source.ts';
import { probeLinks } from './link-probe.ts';

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
  /** cpu and llama.cpp: threads the engine computes on (default: cpu every core, llama.cpp all but one) */
  threads?: number;
  /** cpu: each of the engine's threads on a CPU of its own (Linux) */
  pinThreads?: boolean;
  /** WebRTC data channels to and from tabs (default true; off: those hops use the server relay) */
  webrtc?: boolean;
  /** the stage's limits (chunk size, frame and session caps, idle expiry) */
  limits?: StageLimits;
  /** a public room's trusted secret: the hello proves it, so this node may serve the first and last stages */
  trustedSecret?: string;
  /** rejoin after the control connection drops (default: for 10 minutes, back-off from 0.5 s to 15 s); false: leave */
  reconnect?: false | ReconnectOptions;
  /** measure this node's speed on one layer of the room's model before joining, where the room plans by speed (default true; cpu and webgpu backends) */
  calibrate?: boolean;
  /** test only (test-shaping.ts): forward passes take this many times as long */
  testSlowFactor?: number;
  /** test only (test-shaping.ts): … from this many of the node's forward passes on (default 0: all) */
  testSlowAfter?: number;
  /** test only (test-shaping.ts): every frame and control message in and out waits this long (ms) */
  testLinkDelayMs?: number;
  log?: (line: string) => void;
}

export interface NodePeer {
  readonly peerId: string | null;
  server: FrameServer;
  /** current stage, once assigned and loaded */
  readonly service: StageService | null;
  /** resolves when the peer left the room for good (stopped, left, refused, or gave up rejoining) */
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

/**
 * The server pings every admitted peer (twice a second by default): a server silent for
 * SERVER_SILENCE_MS — a stopped process, a cluster instance frozen past its lease, a cut path
 * whose socket stays open — is treated as gone, so the node rejoins (through a load balancer:
 * at a live instance) instead of waiting on a socket that will never speak again.
 */
export const SERVER_SILENCE_MS = 10_000;

function watchServer(ws: WebSocket, log: (line: string) => void): void {
  let heard = Date.now();
  const hear = (): void => void (heard = Date.now());
  ws.on('ping', hear);
  ws.on('message', hear);
  let tick = Date.now();
  const timer = setInterval(() => {
    const now = Date.now();
    // this thread was busy (the pings may be waiting in the queue): the silence was ours, not the server's
    if (now - tick > 3_000) heard = now;
    tick = now;
    if (ws.readyState !== WebSocket.OPEN || now - heard < SERVER_SILENCE_MS) return;
    log(`the server said nothing for ${((Date.now() - heard) / 1000).toFixed(1)} s; leaving the connection`);
    ws.terminate();
  }, 1_000);
  timer.unref();
  ws.once('close', () => clearInterval(timer));
}

/** What the hello offers: the backend, memory, where frames reach this node, what it holds verified. */
function helloOffer(opts: NodePeerOptions, server: FrameServer, has: { artifact: string; units: string[]; adapter: HelloOffer['adapter']; rtc: boolean; speed: PeerSpeed | null }): HelloOffer {
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
    probesLinks: true,
    ring: true,
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

/** One control connection to the server: its socket, the peer core serving over it, and when it ended. */
interface Connection {
  ws: WebSocket;
  core: PeerCore;
  closed: Promise<string>;
}

/** What stays the same across reconnections: the frame server, WebRTC, the spare GPU, the options. */
interface PeerShared {
  opts: NodePeerOptions;
  base: string;
  roomId: string;
  cacheDir: string | null;
  server: FrameServer;
  rtc: NativeRtc | null;
  /** the current connection's send, for WebRTC's signals */
  send: (m: PeerToServer) => void;
  takeSpareGpu: () => WebGpuBackend | null;
  adapter: HelloOffer['adapter'];
  /** test only: the link delay every frame and control message waits (ms; test-shaping.ts) */
  delay: number;
  /** test only: the node's forward passes so far (`testSlowAfter`; test-shaping.ts) */
  passes: PassCount;
  /** which peer may send this node's stage hidden states over its listen address */
  fence: UpstreamFence;
  log: (line: string) => void;
}

/** Reads the room's model, opens a control socket, proves the secret and joins; rejects if any step fails. */
async function connect(p: PeerShared): Promise<Connection> {
  const { opts, base, roomId, rtc, log, delay } = p;
  // what the room serves, and the manifest every loaded byte is checked against (again after a
  // reconnect: a restarted server may serve another artifact)
  const model = await fetchRoomModel(base, roomId, opts.secret);
  const units = p.cacheDir ? await heldUnits(p.cacheDir, model.manifest) : [];
  let relay: RelayLink | null = null;
  // the control socket opens after the calibration (below): the hello carries its speed
  let control: WebSocket | null = null;
  // the socket is read when the message is sent, not when a test's link delay lets it go: a
  // message from before the socket opened (the calibration's load progress) must not arrive
  // after it opened, ahead of the hello
  const sendLater = later((ws: WebSocket, text: string): void => {
    if (ws.readyState === WebSocket.OPEN) ws.send(text);
  }, delay);
  const send = (m: PeerToServer): void => {
    if (control?.readyState === WebSocket.OPEN) sendLater(control, JSON.stringify(m));
  };
  const env: NativeStageEnv = {
    backend: opts.backend, memoryBytes: opts.memoryBytes, carrier: opts.carrier ?? 'ws', cacheDir: p.cacheDir, base, secret: opts.secret, model, send, log,
    ...(opts.threads ? { threads: opts.threads } : {}),
    ...(opts.pinThreads ? { pinThreads: true } : {}),
    peerId: () => core.peerId,
    takeSpareGpu: p.takeSpareGpu,
    // a browser next stage has no listen address: frames go through the server (peer/relay-link.ts)
    relayTo: (to) => (relay = new RelayLink(to, (r) => send(r as never))),
    rtc: () => rtc,
  };
  const loadShard = async (ctx: LoadContext): Promise<ShardLoad> => {
    const load = await loadNativeShard(ctx, env);
    return { ...load, backend: slowedBackend(load.backend, opts.testSlowFactor ?? 1, opts.testSlowAfter ?? 0, p.passes) };
  };
  const core = new PeerCore({
    secret: opts.secret, send, log,
    ...(opts.limits ? { limits: opts.limits } : {}),
    ...(opts.trustedSecret ? { proofSecret: opts.trustedSecret } : {}),
    loadShard,
    linkNext: async (next, ctx) => {
      const l = await linkNativeNext(next, ctx, env);
      return l.link ? { ...l, link: delayedLink(l.link, delay) } : l;
    },
    onAssign: (a) => {
      rtc?.released();
      rtc?.setUpstream(a.upstreamPeer ?? null);
      p.fence.assigned(a.upstreamPeer ?? null);
    },
    // a repair replaced the previous stage: only its frames (and data channel) are served now
    onUpstream: (peerId) => {
      rtc?.setUpstream(peerId);
      p.fence.moved(peerId);
    },
    // the room's route summary shows this stage's hop and its candidate pairs
    onReady: (a, _load, link) => rtc?.serving(a.routeId, a.stage, link.hop?.kind ?? 'none', link.hop?.candidatePair ?? null),
    onRelease: () => rtc?.released(),
  });
  const speed = await measureSpeed(opts, model, loadShard, log);
  // (a test's link delay answers the server's heartbeat late too: its round trip is the planner's link)
  const ws = (control = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`, { ...tlsOptions(), handshakeTimeout: SERVER_SILENCE_MS, ...(delay > 0 ? { autoPong: false } : {}) })); // a pinned local CA (tls-trust.ts)
  if (delay > 0) ws.on('ping', (data) => setTimeout(() => ws.readyState === WebSocket.OPEN && ws.pong(data), 2 * delay));
  serveFrames(ws, delayedHandler(core.handle, delay));
  watchServer(ws, log);
  const { gone, closed } = watchControl(ws, base);
  ws.on('message', later((data: WebSocket.RawData, isBinary: boolean) => {
    if (isBinary) return; // frames: serveFrames answers them
    let m: ServerMessage;
    try {
      m = parseServerMessage(data.toString());
    } catch (e) {
      return log(`ignored a control message from the server: ${(e as Error).message}`);
    }
    if (core.onMessage(m)) return;
    // the server learning how far the other listening peers are from here (its link matrix)
    if (m.t === 'probe-links') return void probeLinks(m, { secret: opts.secret, wrap: (l) => delayedLink(l, delay) }).then(send);
    // a relay reply is for this node's own relay link, else for the relay WebRTC fell back to
    if (m.t === 'relay-reply' && relay?.deliver(m)) return;
    rtc?.onControl(m);
  }, delay));
  p.send = send;
  try {
    const w = await core.join(helloOffer(opts, p.server, { artifact: model.manifest.artifact.sha256, units, adapter: p.adapter, rtc: rtc !== null, speed }), gone);
    if (w.iceServers?.length) rtc?.useIceServers(w.iceServers);
    log(`joined room ${w.roomId} as ${w.peerId} (model ${w.model.id}, ${w.model.nLayer} layers; holding ${units.length ? units.join(', ') : 'nothing'}); listening at ${p.server.url}`);
  } catch (e) {
    ws.terminate();
    throw e;
  }
  return { ws, core, closed };
}

/**
 * Keeps the peer in the room: when the control connection drops the stage is released and the
 * peer joins again with back-off and jitter, advertising the shards its cache holds verified.
 * Resolves with why it stopped for good.
 */
async function stayJoined(p: PeerShared, state: { current: Connection; stopping: boolean }): Promise<string> {
  for (;;) {
    const why = await state.current.closed;
    await state.current.core.close().catch(() => undefined);
    p.rtc?.released();
    if (state.stopping || p.opts.reconnect === false) return why;
    p.log(`${why}; rejoining`);
    try {
      const next = await rejoin(() => connect(p), p.opts.reconnect ?? {}, () => state.stopping, p.log);
      if (!next) return why;
      state.current = next;
    } catch (e) {
      return `${why}; rejoining failed for good: ${(e as MeshError).code ?? ''} ${(e as Error).message}`;
    }
  }
}

export async function startNodePeer(opts: NodePeerOptions): Promise<NodePeer> {
  const log = opts.log ?? (() => undefined);
  const { base, roomId } = parseJoinUrl(opts.joinUrl);
  const cacheDir = opts.cacheDir === undefined ? join(meshCacheDir(), 'shards') : opts.cacheDir;
  let spareGpu = await spareGpuFor(opts.backend, log);
  const adapter = spareGpu?.adapter;
  const state: { current: Connection | null; stopping: boolean } = { current: null, stopping: false };
  // frames reach whichever connection's core serves now; the listen address stays across reconnections
  const delay = opts.testLinkDelayMs ?? 0;
  const handler: FrameHandler = delayedHandler((f) => (state.current ? state.current.core.handle(f) : Promise.reject(new MeshError('STAGE_NOT_LOADED', 'this peer is not in a room'))), delay);
  const fence = new UpstreamFence(log);
  const server = await startFrameServer({
    host: opts.listenHost ?? '127.0.0.1',
    port: opts.listenPort ?? 0,
    secret: opts.secret,
    // frames over the listen address: only the current upstream's hidden states (upstream-fence.ts)
    handler: (f, origin) => {
      fence.admit(f, origin);
      return handler(f);
    },
    status: () => {
      const core = state.current?.core;
      return { peerId: core?.peerId ?? null, backend: opts.backend, memoryBytes: opts.memoryBytes, routeId: core?.routeId ?? null, ...(core?.service ? core.service.status() : {}), fence: fence.status() };
    },
  });
  const shared: PeerShared = {
    opts, base, roomId, cacheDir, server, log, delay, fence,
    passes: { passes: 0 },
    rtc: null,
    send: () => undefined,
    adapter: adapter ? { ...adapter } : undefined,
    takeSpareGpu: () => {
      const gpu = spareGpu;
      spareGpu = null;
      return gpu;
    },
  };
  // data channels to and from tabs (./native-rtc.ts); null where WebRTC is off or will not load
  // (loaded before the control socket opens: its challenge must find the listener)
  shared.rtc = opts.webrtc === false ? null : await NativeRtc.start({ sendJson: (m) => shared.send(m as PeerToServer), handler, log });
  let first: Connection;
  try {
    first = await connect(shared);
  } catch (e) {
    await shared.rtc?.close();
    await spareGpu?.dispose();
    await server.close();
    throw e;
  }
  state.current = first;
  const closed = stayJoined(shared, state as { current: Connection; stopping: boolean });
  return {
    get peerId() {
      return state.current?.core.peerId ?? null;
    },
    server,
    get service() {
      return state.current?.core.service ?? null;
    },
    closed,
    // a peer that leaves does not rejoin when the server then closes its socket
    leave: (timeoutMs = 40_000) => {
      state.stopping = true;
      return state.current ? state.current.core.leave(timeoutMs) : Promise.resolve(true);
    },
    async close() {
      state.stopping = true;
      state.current?.ws.close();
      await state.current?.core.close();
      await shared.rtc?.close();
      await spareGpu?.dispose();
      spareGpu = null;
      await server.close();
    },
  };
}
