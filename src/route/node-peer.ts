// A native peer: listens for frames (WebSocket + binary HTTP), joins a room over its control
// WebSocket, proves the secret, advertises backend and memory, and serves the stage it is
// assigned — reading only that shard's byte ranges from the server — with hidden states sent
// straight to the next stage's listen address.

import { mkdir, rename, stat } from 'node:fs/promises';
import { createWriteStream } from 'node:fs';
import { basename, join } from 'node:path';
import { tmpdir } from 'node:os';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import WebSocket from 'ws';
import { MeshError } from '../errors.ts';
import type { ShardRange, StageBackend } from '../backends/types.ts';
import { openTensorSource } from '../gguf/source.ts';
import type { ByteTensorSource } from '../gguf/source.ts';
import { Sampler } from '../model/sampler.ts';
import { startFrameServer } from '../transport/frame-server.ts';
import type { FrameServer } from '../transport/frame-server.ts';
import { serveFrames, WsLink } from '../transport/ws.ts';
import { helloProof, parseRoomUrl } from './control.ts';
import type { PeerToServer, ServerToPeer } from './control.ts';
import { StageService } from './stage-service.ts';
import type { SamplerFactory } from './stage-service.ts';

export type BackendKind = 'cpu' | 'llamacpp';

export interface NodePeerOptions {
  joinUrl: string;
  secret: string;
  backend: BackendKind;
  memoryBytes: number;
  layers?: ShardRange;
  listenHost?: string;
  listenPort?: number;
  name?: string;
  /** where llama.cpp nodes keep downloaded model files */
  cacheDir?: string;
  log?: (line: string) => void;
}

export const stageSampler: SamplerFactory = (settings) => {
  const sampler = new Sampler(settings);
  return (logits) => sampler.sample(logits, []);
};

async function makeBackend(kind: BackendKind): Promise<StageBackend> {
  if (kind === 'cpu') {
    const { CpuBackend } = await import('../backends/cpu/backend.ts');
    return new CpuBackend();
  }
  const { LlamaCppStage } = await import('../backends/llamacpp/stage.ts');
  return new LlamaCppStage({ kvType: 'f32', flashAttention: false });
}

/** llama.cpp reads local files only: fetch the whole artifact once into the cache. */
async function localCopy(url: string, headers: Record<string, string>, cacheDir: string, id: string): Promise<string> {
  await mkdir(cacheDir, { recursive: true });
  const path = join(cacheDir, `${id}.gguf`);
  const head = await fetch(url, { method: 'HEAD', headers });
  const size = Number(head.headers.get('content-length'));
  const have = await stat(path).catch(() => null);
  if (have && have.size === size) return path;
  const res = await fetch(url, { headers });
  if (!res.ok || !res.body) throw new MeshError('MODEL_FETCH_FAILED', `GET ${url}: HTTP ${res.status}`);
  await pipeline(Readable.fromWeb(res.body as never), createWriteStream(`${path}.part`));
  await rename(`${path}.part`, path);
  return path;
}

export interface NodePeer {
  peerId: string | null;
  server: FrameServer;
  /** current stage, once assigned and loaded */
  service: StageService | null;
  /** resolves when the control connection ends */
  closed: Promise<string>;
  close(): Promise<void>;
}

export async function startNodePeer(opts: NodePeerOptions): Promise<NodePeer> {
  const log = opts.log ?? (() => undefined);
  const { base, roomId } = parseRoomUrl(opts.joinUrl);
  const auth = { authorization: `Bearer ${opts.secret}` };
  let current: { routeId: number; shard: ShardRange; backend: StageBackend; service: StageService; downstream: WsLink | null; source: ByteTensorSource | null } | null = null;
  const handler = async (f: Parameters<StageService['handle']>[0]) => {
    if (!current) throw new MeshError('STAGE_NOT_LOADED', 'this peer serves no stage yet');
    return current.service.handle(f);
  };
  const server = await startFrameServer({
    host: opts.listenHost ?? '127.0.0.1',
    port: opts.listenPort ?? 0,
    secret: opts.secret,
    handler,
    status: () => ({ peerId: peer.peerId, backend: opts.backend, memoryBytes: opts.memoryBytes, routeId: current?.routeId ?? null, ...(current ? current.service.status() : {}) }),
  });

  const ws = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`);
  const send = (m: PeerToServer): void => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m));
  };
  serveFrames(ws, handler);

  const release = async (): Promise<void> => {
    if (!current) return;
    const c = current;
    current = null;
    await c.service.releaseAll();
    await c.downstream?.close();
    await c.source?.close();
    await c.backend.dispose();
  };

  const assign = async (m: Extract<ServerToPeer, { t: 'assign' }>): Promise<void> => {
    const t0 = performance.now();
    try {
      await release();
      const backend = await makeBackend(opts.backend);
      const headers = { ...auth, 'x-mesh-peer': peer.peerId ?? 'unknown' };
      let source: ByteTensorSource;
      if (opts.backend === 'llamacpp') {
        // keyed by the file name; localCopy re-fetches when the size differs
        const name = basename(new URL(m.modelUrl).pathname, '.gguf').replace(/[^A-Za-z0-9_.-]/g, '_');
        const path = await localCopy(m.modelUrl, headers, opts.cacheDir ?? join(tmpdir(), 'gguf-mesh-cache'), name);
        source = await openTensorSource(path);
      } else {
        source = await openTensorSource(m.modelUrl, { headers });
      }
      await backend.load(source, m.shard);
      const downstream = m.downstream ? await WsLink.connect(m.downstream, { headers: auth }) : null;
      const service = new StageService({ backend, stage: m.stage, shard: m.shard, nLayer: m.nLayer, downstream, samplerFactory: stageSampler });
      current = { routeId: m.routeId, shard: m.shard, backend, service, downstream, source };
      const bytesRead = source.bytes.stats.bytesRead;
      log(`stage ${m.stage} of route ${m.routeId}: layers ${m.shard.start}-${m.shard.end} ready (${bytesRead} bytes read)`);
      send({ t: 'ready', routeId: m.routeId, stage: m.stage, loadMs: performance.now() - t0, bytesRead });
    } catch (e) {
      const err = e instanceof MeshError ? e : new MeshError('LOAD_FAILED', (e as Error).message);
      log(`stage ${m.stage} of route ${m.routeId}: load failed: ${err.code} ${err.message}`);
      send({ t: 'load-failed', routeId: m.routeId, stage: m.stage, code: err.code, message: err.message });
    }
  };

  let resolveClosed!: (why: string) => void;
  const closed = new Promise<string>((r) => (resolveClosed = r));
  const peer: NodePeer = {
    peerId: null,
    server,
    get service() {
      return current?.service ?? null;
    },
    closed,
    async close() {
      ws.close();
      await release();
      await server.close();
    },
  };

  const joined = new Promise<void>((resolve, reject) => {
    ws.once('error', (e) => reject(new MeshError('JOIN_FAILED', `cannot reach ${base}: ${e.message}`)));
    ws.on('message', (data, isBinary) => {
      if (isBinary) return;
      const m = JSON.parse(data.toString()) as ServerToPeer;
      if (m.t === 'challenge') {
        send({
          t: 'hello',
          proof: helloProof(opts.secret, m.nonce),
          backend: opts.backend,
          memoryBytes: opts.memoryBytes,
          listen: server.wsUrl,
          httpUrl: server.url,
          ...(opts.name ? { name: opts.name } : {}),
          ...(opts.layers ? { layers: opts.layers } : {}),
        });
      } else if (m.t === 'welcome') {
        peer.peerId = m.peerId;
        log(`joined room ${m.roomId} as ${m.peerId} (model ${m.model.id}, ${m.model.nLayer} layers); listening at ${server.url}`);
        resolve();
      } else if (m.t === 'assign') {
        void assign(m);
      } else if (m.t === 'release') {
        if (current?.routeId === m.routeId) void release();
      } else if (m.t === 'error') {
        reject(new MeshError(m.code, m.message));
      }
    });
    ws.on('close', (code, reason) => {
      const why = `control connection closed (${code}${reason.length ? ` ${reason.toString()}` : ''})`;
      reject(new MeshError('JOIN_FAILED', why));
      resolveClosed(why);
    });
  });
  try {
    await joined;
  } catch (e) {
    ws.terminate();
    await server.close();
    throw e;
  }
  return peer;
}
