// A native peer: listens for frames (WebSocket + binary HTTP), joins a room over its control
// WebSocket, proves the secret, advertises backend and memory, and serves the stage it is
// assigned — reading only that shard's byte ranges from the server — with hidden states sent
// straight to the next stage's listen address.

import { mkdir, rename, stat } from 'node:fs/promises';
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { meshCacheDir } from '../cache-dir.ts';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import WebSocket from 'ws';
import { MeshError } from '../errors.ts';
import type { ShardRange, StageBackend } from '../backends/types.ts';
import type { WebGpuBackend } from '../backends/webgpu/backend.ts';
import type { AdapterSummary } from '../backends/webgpu/device.ts';
import { openArtifactReader, openTensorSource, tensorSourceOver } from '../gguf/source.ts';
import { artifactFiles, splitPartName } from '../gguf/split.ts';
import type { Manifest } from '../gguf/verify.ts';
import { parseManifest } from '../gguf/verify.ts';
import type { TensorSource } from '../gguf/types.ts';
import { headerFromWire } from '../protocol/header-wire.ts';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { unlink } from 'node:fs/promises';
import { Sampler } from '../model/sampler.ts';
import { startFrameServer } from '../transport/frame-server.ts';
import type { FrameServer } from '../transport/frame-server.ts';
import { serveFrames, WsLink } from '../transport/ws.ts';
import { HttpLink } from '../transport/http.ts';
import { helloProof, parseJoinUrl } from '../protocol/control.ts';
import { fetchJson } from '../route/remote.ts';
import type { RoomSummary } from '../route/remote.ts';
import { heldUnits, VerifiedSource } from './verified-source.ts';
import type { PeerToServer, ServerToPeer } from '../protocol/control.ts';
import { RelayLink } from './relay-link.ts';
import type { RelayReply } from '../protocol/control.ts';
import type { FrameLink } from '../transport/link.ts';
import { StageService } from './stage-service.ts';
import { backendCapability } from '../backends/capabilities.ts';
import type { SamplerFactory } from './stage-service.ts';

export type BackendKind = 'cpu' | 'llamacpp' | 'webgpu';

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

export const stageSampler: SamplerFactory = (settings) => {
  const sampler = new Sampler(settings);
  return (logits) => sampler.sample(logits, []);
};

/** A WebGPU stage on Dawn in this process; loaded lazily, so other backends never start Dawn. */
async function nodeWebGpuBackend(): Promise<WebGpuBackend> {
  return (await import('../backends/webgpu/node.ts')).createNodeWebGpuBackend();
}

async function makeBackend(kind: BackendKind, wholeModel: boolean, memoryBytes: number): Promise<StageBackend> {
  if (kind === 'webgpu') return nodeWebGpuBackend();
  if (kind === 'cpu') {
    const { CpuBackend } = await import('../backends/cpu/backend.ts');
    return new CpuBackend();
  }
  // llama.cpp: the whole model from its own file (any architecture llama.cpp loads), a layer range from a shard GGUF
  if (!wholeModel) {
    const { LlamaCppRangeStage } = await import('../backends/llamacpp/range-stage.ts');
    return new LlamaCppRangeStage({ kvType: 'f32', flashAttention: false, memoryBytes });
  }
  const { LlamaCppStage } = await import('../backends/llamacpp/stage.ts');
  return new LlamaCppStage({ kvType: 'f32', flashAttention: false });
}

/** sha256 of a file, reporting the bytes hashed so far. */
async function fileSha256(path: string, onBytes: (n: number) => void = () => undefined): Promise<string> {
  const h = createHash('sha256');
  let n = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) {
    h.update(chunk as Buffer);
    onBytes((n += (chunk as Buffer).length));
  }
  return h.digest('hex');
}

/** Downloads `url` to `path`, hashing as the bytes pass; returns the sha256. */
async function download(url: string, headers: Record<string, string>, path: string, onBytes: (n: number) => void): Promise<string> {
  const res = await fetch(url, { headers });
  if (!res.ok || !res.body) {
    await res.body?.cancel();
    throw new MeshError('MODEL_FETCH_FAILED', `GET ${url}: HTTP ${res.status}`);
  }
  const h = createHash('sha256');
  let n = 0;
  await pipeline(
    Readable.fromWeb(res.body as never),
    async function* (chunks: AsyncIterable<Buffer>) {
      for await (const chunk of chunks) {
        h.update(chunk);
        onBytes((n += chunk.length));
        yield chunk;
      }
    },
    createWriteStream(path),
  );
  return h.digest('hex');
}

/**
 * llama.cpp reads local files only: fetch the whole artifact once into the cache, named by
 * its sha256 (a split GGUF's parts as `<sha256>-0000k-of-0000n.gguf`, which llama.cpp loads
 * from the first), and verify every file against the manifest (a cached copy is re-verified;
 * a mismatch is fetched once more, then refused). `onProgress` hears bytes verified so far of
 * the artifact's size.
 */
async function localCopy(
  url: string,
  headers: Record<string, string>,
  cacheDir: string,
  manifest: Manifest,
  onProgress: (done: number, total: number) => void,
): Promise<{ path: string; bytesFetched: number }> {
  await mkdir(cacheDir, { recursive: true });
  const sha = manifest.artifact.sha256;
  const files = manifest.artifact.files;
  const urls = artifactFiles(url);
  if (urls.length !== files.length) {
    throw new MeshError('GGUF_BAD_SPLIT', `the manifest lists ${files.length} file(s) but ${url} names ${urls.length}`);
  }
  const names = files.length === 1 ? [`${sha}.gguf`] : files.map((_, k) => splitPartName(sha, k, files.length));
  const total = manifest.artifact.size;
  let before = 0; // bytes of the files already verified
  let bytesFetched = 0;
  onProgress(0, total);
  for (let k = 0; k < files.length; k++) {
    const want = files[k]!;
    const path = join(cacheDir, names[k]!);
    const have = await stat(path).catch(() => null);
    const cachedOk = have?.size === want.size && (await fileSha256(path, (n) => onProgress(before + n, total))) === want.sha256;
    if (!cachedOk) {
      for (let attempt = 0; ; attempt++) {
        const got = await download(urls[k]!, headers, `${path}.part`, (n) => onProgress(before + n, total));
        bytesFetched += (await stat(`${path}.part`)).size;
        if (got === want.sha256) break;
        await unlink(`${path}.part`).catch(() => undefined);
        if (attempt === 1) {
          throw new MeshError('ARTIFACT_HASH_MISMATCH', `file ${k + 1} of ${files.length} of artifact ${sha} from ${urls[k]}: expected sha256 ${want.sha256}, got ${got}`, { file: k, expected: want.sha256, actual: got });
        }
      }
      await rename(`${path}.part`, path);
    }
    before += want.size;
  }
  onProgress(total, total);
  return { path: join(cacheDir, names[0]!), bytesFetched };
}

/** A binary-HTTP link to the node whose frames WebSocket is `wsUrl`, checked with GET /v1/status. */
async function httpLinkTo(wsUrl: string, auth: Record<string, string>): Promise<HttpLink> {
  const base = wsUrl.replace(/^ws/, 'http').replace(/\/v1\/frames$/, '');
  let res: Response;
  try {
    res = await fetch(`${base}/v1/status`, { headers: auth, signal: AbortSignal.timeout(5000) });
  } catch (e) {
    throw new MeshError('LINK_FAILED', `cannot reach ${base}: ${(e as Error).message}`);
  }
  if (!res.ok) throw new MeshError(res.status === 401 ? 'AUTH_FAILED' : 'LINK_FAILED', `${base}/v1/status answered HTTP ${res.status}`);
  return new HttpLink(base, auth);
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
  const { base, roomId } = parseJoinUrl(opts.joinUrl);
  const auth = { authorization: `Bearer ${opts.secret}` };
  const cacheDir = opts.cacheDir === undefined ? join(meshCacheDir(), 'shards') : opts.cacheDir;
  // what the room serves, and the manifest every loaded byte is checked against
  const room = await fetchJson<RoomSummary>(`${base}/v1/rooms/${roomId}`, opts.secret);
  const manifest = parseManifest(await fetchJson<unknown>(`${base}/v1/models/${room.model.id}/manifest`, opts.secret));
  const units = cacheDir ? await heldUnits(cacheDir, manifest) : [];
  // webgpu: get a device before joining, so a host without an adapter fails at once
  // (WEBGPU_UNAVAILABLE) instead of at its first assignment, and the room sees the adapter.
  // That first device serves the first assignment; later ones get a fresh device.
  let spareGpu: WebGpuBackend | null = null;
  if (opts.backend === 'webgpu') {
    try {
      spareGpu = await nodeWebGpuBackend();
    } catch (e) {
      if ((e as MeshError).code !== 'WEBGPU_UNAVAILABLE') throw e;
      throw new MeshError('WEBGPU_UNAVAILABLE', `--backend webgpu: ${(e as Error).message} (Dawn found no usable GPU here; use --backend cpu)`);
    }
  }
  const adapter: AdapterSummary | undefined = spareGpu?.adapter;
  if (adapter) log(`webgpu adapter: ${[adapter.vendor, adapter.architecture, adapter.description].filter(Boolean).join(' ') || 'unnamed'}${adapter.isFallbackAdapter ? ' (software)' : ''}`);
  let current: { routeId: number; shard: ShardRange; backend: StageBackend; service: StageService; downstream: FrameLink | null; source: TensorSource | null } | null = null;
  let relay: RelayLink | null = null;
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
    let lastProgress = 0;
    // loading progress for the room's telemetry, at most every 100 ms (and at the end)
    const progress = (done: number, total: number): void => {
      const now = performance.now();
      if (done < total && now - lastProgress < 100) return;
      lastProgress = now;
      send({ t: 'loading', routeId: m.routeId, stage: m.stage, bytesDone: done, bytesTotal: total });
    };
    let loading: StageBackend | null = null; // disposed if the load fails (a GPU device must not leak)
    try {
      await release();
      const spare = spareGpu;
      spareGpu = null;
      const wholeModel = m.shard.start === 0 && m.shard.end === m.nLayer;
      const backend = (loading = spare ?? (await makeBackend(opts.backend, wholeModel, opts.memoryBytes)));
      // the secret and peer id go only to the server's own model hosting, never to a third-party URL
      const ownHost = new URL(m.modelUrl).origin === new URL(base).origin;
      const headers: Record<string, string> = ownHost ? { ...auth, 'x-mesh-peer': peer.peerId ?? 'unknown' } : {};
      let source: TensorSource;
      let fetched: () => number;
      if (opts.backend === 'llamacpp' && wholeModel) {
        const copy = await localCopy(m.modelUrl, headers, cacheDir ?? join(tmpdir(), 'gguf-mesh-cache'), manifest, progress);
        source = await openTensorSource(copy.path);
        fetched = () => copy.bytesFetched;
      } else {
        // the header comes as JSON from the server: no model bytes for it
        const header = headerFromWire(await fetchJson<unknown>(`${base}/v1/models/${room.model.id}/header`, opts.secret));
        const verified = new VerifiedSource({
          header,
          manifest,
          cacheDir,
          location: m.modelUrl,
          // a split artifact reads as its parts concatenated (the header's offsets address that)
          openInner: async () =>
            tensorSourceOver(
              header,
              await openArtifactReader(
                artifactFiles(m.modelUrl),
                manifest.artifact.files.map((f) => f.size),
                { headers },
              ),
            ),
          log,
          onProgress: progress,
        });
        source = verified;
        fetched = () => verified.bytesFetched;
      }
      await backend.load(source, m.shard);
      // a browser next stage has no listen address: frames go through the server (src/peer/relay.ts)
      const viaRelay = (to: string): RelayLink => (relay = new RelayLink(to, (r) => ws.send(JSON.stringify(r))));
      let downstream: FrameLink | null = null;
      if (m.downstream) {
        try {
          downstream = opts.carrier === 'http' ? await httpLinkTo(m.downstream, auth) : await WsLink.connect(m.downstream, { headers: auth, connectTimeoutMs: 5000 });
        } catch (e) {
          // reachable by the server but not by us (NAT, firewall): relay rather than fail
          if (!m.downstreamPeer) throw e;
          log(`next stage ${m.downstream} not reachable (${(e as Error).message}); relaying through the server`);
          downstream = viaRelay(m.downstreamPeer);
        }
      } else if (m.downstreamPeer) downstream = viaRelay(m.downstreamPeer);
      const service = new StageService({ backend, stage: m.stage, shard: m.shard, nLayer: m.nLayer, downstream, samplerFactory: stageSampler });
      current = { routeId: m.routeId, shard: m.shard, backend, service, downstream, source };
      const bytesRead = fetched();
      const hop = !downstream ? 'last stage' : downstream instanceof RelayLink ? 'next stage via server relay' : downstream instanceof HttpLink ? 'next stage over http' : 'next stage over ws';
      log(`stage ${m.stage} of route ${m.routeId}: layers ${m.shard.start}-${m.shard.end} ready (${bytesRead} bytes read; ${hop})`);
      send({ t: 'ready', routeId: m.routeId, stage: m.stage, loadMs: performance.now() - t0, bytesRead });
    } catch (e) {
      const err = e instanceof MeshError ? e : new MeshError('LOAD_FAILED', (e as Error).message);
      if (loading && current?.backend !== loading) await loading.dispose().catch(() => undefined);
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
      await spareGpu?.dispose();
      spareGpu = null;
      await server.close();
    },
  };

  const joined = new Promise<void>((resolve, reject) => {
    ws.once('error', (e) => reject(new MeshError('JOIN_FAILED', `cannot reach ${base}: ${e.message}`)));
    ws.on('message', (data, isBinary) => {
      if (isBinary) return;
      const m = JSON.parse(data.toString()) as ServerToPeer;
      if (m.t === 'challenge') {
        void helloProof(opts.secret, m.nonce).then((proof) => send({
          t: 'hello',
          proof,
          backend: opts.backend,
          memoryBytes: opts.memoryBytes,
          serves: backendCapability(opts.backend),
          listen: opts.advertise ?? server.wsUrl,
          httpUrl: opts.advertise ? opts.advertise.replace(/^ws/, 'http').replace(/\/v1\/frames$/, '') : server.url,
          artifact: manifest.artifact.sha256,
          units,
          ...(opts.name ? { name: opts.name } : {}),
          ...(opts.layers ? { layers: opts.layers } : {}),
          ...(adapter ? { adapter } : {}),
        }));
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
      } else if ((m as { t: string }).t === 'relay-reply') {
        relay?.deliver(m as unknown as RelayReply);
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
    await spareGpu?.dispose();
    await server.close();
    throw e;
  }
  return peer;
}
