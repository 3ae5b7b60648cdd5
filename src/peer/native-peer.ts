// A native peer: listens for frames (WebSocket + binary HTTP), joins a room over its control
// WebSocket, and serves the stage it is assigned (peer-core.ts: hello, assign, release; the
// loading itself in native-stage.ts) — reading only that shard's byte ranges from the server —
// with hidden states sent straight to the next stage's listen address.

import { join } from 'node:path';
import WebSocket from 'ws';
import { meshCacheDir } from '../cache-dir.ts';
import { MeshError } from '../errors.ts';
import type { ShardRange } from '../backends/types.ts';
import type { WebGpuBackend } from '../backends/webgpu/backend.ts';
import { parseJoinUrl, parseServerMessage } from '../protocol/control.ts';
import type { PeerToServer, ServerMessage } from '../protocol/control.ts';
import { startFrameServer } from '../transport/frame-server.ts';
import type { FrameServer } from '../transport/frame-server.ts';
import { serveFrames } from '../transport/ws.ts';
import { loadNativeStage, nodeWebGpuBackend } from './native-stage.ts';
import type { BackendKind, NativeStageEnv } from './native-stage.ts';
import { fetchRoomModel, PeerCore } from './peer-core.ts';
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
  log?: (line: string) => void;
}

export interface NodePeer {
  readonly peerId: string | null;
  server: FrameServer;
  /** current stage, once assigned and loaded */
  readonly service: StageService | null;
  /** resolves when the control connection ends */
  closed: Promise<string>;
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
  // the control socket opens once the frame server listens: the hello names its address
  let control: WebSocket | null = null;
  const send = (m: PeerToServer): void => {
    if (control?.readyState === WebSocket.OPEN) control.send(JSON.stringify(m));
  };
  const env: NativeStageEnv = {
    backend: opts.backend, carrier: opts.carrier ?? 'ws', cacheDir, base, secret: opts.secret, model, send, log,
    peerId: () => core.peerId,
    takeSpareGpu: () => {
      const gpu = spareGpu;
      spareGpu = null;
      return gpu;
    },
    // a browser next stage has no listen address: frames go through the server (peer/relay-link.ts)
    relayTo: (to) => (relay = new RelayLink(to, (r) => control!.send(JSON.stringify(r)))),
  };
  const core = new PeerCore({ secret: opts.secret, send, log, loadStage: (ctx) => loadNativeStage(ctx, env) });
  const server = await startFrameServer({
    host: opts.listenHost ?? '127.0.0.1',
    port: opts.listenPort ?? 0,
    secret: opts.secret,
    handler: core.handle,
    status: () => ({ peerId: core.peerId, backend: opts.backend, memoryBytes: opts.memoryBytes, routeId: core.routeId, ...(core.service ? core.service.status() : {}) }),
  });

  const ws = (control = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`));
  serveFrames(ws, core.handle);
  const { gone, closed } = watchControl(ws, base);
  ws.on('message', (data, isBinary) => {
    if (isBinary) return; // frames: serveFrames answers them
    let m: ServerMessage;
    try {
      m = parseServerMessage(data.toString());
    } catch (e) {
      return log(`ignored a control message from the server: ${(e as Error).message}`);
    }
    if (!core.onMessage(m) && m.t === 'relay-reply') relay?.deliver(m);
  });
  const joining = core.join(
    {
      backend: opts.backend,
      memoryBytes: opts.memoryBytes,
      listen: opts.advertise ?? server.wsUrl,
      httpUrl: opts.advertise ? opts.advertise.replace(/^ws/, 'http').replace(/\/v1\/frames$/, '') : server.url,
      artifact: model.manifest.artifact.sha256,
      units,
      ...(opts.name ? { name: opts.name } : {}),
      ...(opts.layers ? { layers: opts.layers } : {}),
      ...(adapter ? { adapter: { ...adapter } } : {}),
    },
    gone,
  );
  try {
    const w = await joining;
    log(`joined room ${w.roomId} as ${w.peerId} (model ${w.model.id}, ${w.model.nLayer} layers); listening at ${server.url}`);
  } catch (e) {
    ws.terminate();
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
    async close() {
      ws.close();
      await core.close();
      await spareGpu?.dispose();
      spareGpu = null;
      await server.close();
    },
  };
}
