// Loading an assigned stage in a native node: a backend (cpu, llama.cpp — the whole model, or a
// layer range through a shard GGUF — or WebGPU on Dawn), the shard's bytes (only its byte
// ranges, verified and cached by artifact sha256; llama.cpp's whole model: a whole local copy),
// and the link to the next stage — WebSocket or binary HTTP to its listen address, naming this
// peer (x-mesh-peer: the next stage serves only its current upstream); to a tab (no
// listen address) a WebRTC data channel (native-rtc.ts); the server relay when WebRTC is off or
// opens no channel, or the listen address cannot be reached from here.

import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import type { WebGpuBackend } from '../backends/webgpu/backend.ts';
import { openArtifactReader, openTensorSource, tensorSourceOver } from '../gguf/source.ts';
import { artifactFiles } from '../gguf/split.ts';
import type { TensorSource } from '../gguf/types.ts';
import type { CandidatePair, HopKind, PeerToServer } from '../protocol/control.ts';
import { PEER_HEADER } from '../transport/link.ts';
import { HttpLink } from '../transport/http.ts';
import type { FrameLink } from '../transport/link.ts';
import { WsLink } from '../transport/ws.ts';
import { localCopy } from './local-copy.ts';
import type { NativeRtc } from './native-rtc.ts';
import { modelHeaders, progressGate } from './peer-core.ts';
import type { Assignment, LoadContext, NextLink, NextStage, RoomModel, ShardLoad, Standby } from './peer-core.ts';
import { RelayLink } from './relay-link.ts';
import { VerifiedSource } from './verified-source.ts';

export type BackendKind = 'cpu' | 'llamacpp' | 'webgpu';

/** A WebGPU stage on Dawn in this process; loaded lazily, so other backends never start Dawn. */
export async function nodeWebGpuBackend(): Promise<WebGpuBackend> {
  return (await import('../backends/webgpu/node.ts')).createNodeWebGpuBackend();
}

async function makeBackend(kind: BackendKind, wholeModel: boolean, memoryBytes: number, threads: number | undefined, pinThreads: boolean): Promise<StageBackend> {
  if (kind === 'webgpu') return nodeWebGpuBackend();
  // in a worker thread: a load or a prefill chunk takes seconds on a real model, and this
  // thread must answer the server's heartbeat and read frames meanwhile
  const { stageBackendInThread } = await import('../../workers/stage-thread.ts');
  const given = threads ? { threads } : {};
  if (kind === 'cpu') return stageBackendInThread('cpu', { ...given, ...(pinThreads ? { pinThreads } : {}) });
  // llama.cpp: the whole model from its own file (any architecture llama.cpp loads), a layer range from a shard GGUF
  if (!wholeModel) return stageBackendInThread('llamacpp-range', { kvType: 'f32', flashAttention: false, memoryBytes, ...given });
  return stageBackendInThread('llamacpp', { kvType: 'f32', flashAttention: false, ...given });
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

/** What a native node's loads share. */
export interface NativeStageEnv {
  backend: BackendKind;
  /** cpu and llama.cpp: threads the engine computes on (default: cpu every core, llama.cpp all but one) */
  threads?: number;
  /** cpu: each of the engine's threads on a CPU of its own (Linux; backends/cpu/node-threads.ts) */
  pinThreads?: boolean;
  /** the memory this node offers (a llama.cpp range stage admits sessions within it) */
  memoryBytes: number;
  /** how hidden states go to the next stage */
  carrier: 'ws' | 'http';
  /** verified shards and whole llama.cpp copies; null = no cache */
  cacheDir: string | null;
  /** the signaling server's origin, and the room secret */
  base: string;
  secret: string;
  model: RoomModel;
  send: (m: PeerToServer) => void;
  log: (line: string) => void;
  peerId: () => string | null;
  /** the WebGPU device made before joining, once (later loads make their own) */
  takeSpareGpu: () => WebGpuBackend | null;
  /** a link to peer `to` through the server */
  relayTo: (to: string) => RelayLink;
  /** this node's WebRTC, or null (off, or it did not load) */
  rtc: () => NativeRtc | null;
}

/** The link to the next stage and how it is carried. */
interface NextHop {
  link: FrameLink | null;
  kind: HopKind;
  candidatePair: CandidatePair | null;
}

/** Whether the assignment is every layer of the model (llama.cpp then loads the model's own file). */
function isWholeModel(a: Assignment | Standby): boolean {
  return a.shard.start === 0 && a.shard.end === a.nLayer;
}

/** Reads the shard's tensors: llama.cpp's whole model from a whole local copy; a range, and the other backends, only the shard's ranges. */
async function openShard(a: Assignment | Standby, env: NativeStageEnv, progress: (done: number, total: number) => void): Promise<{ source: TensorSource; fetched: () => number }> {
  // the secret and peer id go only to the server's own model hosting, never to a third-party URL
  const headers = modelHeaders(a.modelUrl, env.base, env.secret, env.peerId());
  const manifest = env.model.manifest;
  if (env.backend === 'llamacpp' && isWholeModel(a)) {
    const copy = await localCopy(a.modelUrl, headers, env.cacheDir ?? join(tmpdir(), 'gguf-mesh-cache'), manifest, progress);
    return { source: await openTensorSource(copy.path), fetched: () => copy.bytesFetched };
  }
  const header = await env.model.header();
  const verified = new VerifiedSource({
    header,
    manifest,
    cacheDir: env.cacheDir,
    location: a.modelUrl,
    // a split artifact reads as its parts concatenated (the header's offsets address that)
    openInner: async () =>
      tensorSourceOver(header, await openArtifactReader(artifactFiles(a.modelUrl), manifest.artifact.files.map((f) => f.size), { headers })),
    log: env.log,
    onProgress: progress,
  });
  return { source: verified, fetched: () => verified.bytesFetched };
}

const relayed = (link: RelayLink): NextHop => ({ link, kind: 'relay', candidatePair: null });

/**
 * The link to the next stage: none on the last stage; to a tab (no listen address) a data
 * channel, else the relay; to a native node its listen address, the relay when out of reach.
 */
async function connectNext(a: NextStage, env: NativeStageEnv): Promise<NextHop> {
  // the next stage serves hidden states only from its current upstream: say who sends them
  const peerId = env.peerId();
  const auth = { authorization: `Bearer ${env.secret}`, ...(peerId ? { [PEER_HEADER]: peerId } : {}) };
  if (!a.downstream) {
    if (!a.downstreamPeer) return { link: null, kind: 'none', candidatePair: null };
    const rtc = env.rtc();
    // a data channel from here; Hops falls back to the relay when none opens
    if (rtc) return rtc.connectDownstream(a.downstreamPeer);
    return relayed(env.relayTo(a.downstreamPeer));
  }
  try {
    if (env.carrier === 'http' && !a.ringLink) return { link: await httpLinkTo(a.downstream, auth), kind: 'http', candidatePair: null };
    return { link: await WsLink.connect(a.downstream, { headers: auth, connectTimeoutMs: 5000 }), kind: 'ws', candidatePair: null };
  } catch (e) {
    // reachable by the server but not by us (NAT, firewall): relay rather than fail
    if (!a.downstreamPeer) throw e;
    env.log(`next stage ${a.downstream} not reachable (${(e as Error).message}); relaying through the server`);
    return relayed(env.relayTo(a.downstreamPeer));
  }
}

const HOP_NAMES: Record<HopKind, string> = {
  none: 'last stage',
  relay: 'next stage via server relay',
  http: 'next stage over http',
  ws: 'next stage over ws',
  webrtc: 'next stage over a WebRTC data channel',
};

/** PeerCore's `loadShard` for a native node: the backend holding the verified shard. */
export async function loadNativeShard(ctx: LoadContext, env: NativeStageEnv): Promise<ShardLoad> {
  const a = ctx.assignment;
  // loading progress for the room's telemetry, at most every 100 ms (and at the end)
  const due = progressGate(100);
  const progress = (done: number, total: number): void => {
    if (due(done, total)) env.send({ t: 'loading', routeId: a.routeId, stage: a.stage, bytesDone: done, bytesTotal: total });
  };
  // disposed if the load fails: a GPU device must not leak
  const backend = ctx.keep(env.takeSpareGpu() ?? (await makeBackend(env.backend, isWholeModel(a), env.memoryBytes, env.threads, env.pinThreads === true)), (b) => b.dispose());
  const { source, fetched } = await openShard(a, env, progress);
  ctx.keep(source, (s) => s.close());
  await backend.load(source, a.shard);
  const bytesRead = fetched();
  // what the engine computes on, as it says (a worker thread's engine tells after its load)
  const engineThreads = (backend as { info?: { threads?: number } | null }).info?.threads;
  return { backend, bytesRead, detail: `${bytesRead} bytes read${engineThreads ? `; ${engineThreads} thread${engineThreads === 1 ? '' : 's'}` : ''}` };
}

/** PeerCore's `linkNext` for a native node: the next stage of an assignment, or of a rewire after a repair. */
export async function linkNativeNext(next: NextStage, ctx: LoadContext, env: NativeStageEnv): Promise<NextLink> {
  const hop = await connectNext(next, env);
  if (hop.link) ctx.keep(hop.link, (l) => l.close());
  return { link: hop.link, detail: HOP_NAMES[hop.kind], hop: { kind: hop.kind, candidatePair: hop.candidatePair } };
}
