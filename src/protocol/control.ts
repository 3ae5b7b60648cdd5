// JSON control messages between a peer and the signaling server, sent as WebSocket text
// messages on the peer's control connection (binary messages on the same socket are frames:
// session open/close/status from the server to the stage). The secret never crosses the
// wire: the peer proves it with an HMAC of the server's nonce. Native nodes, browser tabs and
// the server all read these types; nothing here needs Node (the HMAC is SubtleCrypto's).
//
// Browser peers add, all routed by the server between peers of the same room:
//   peer → server  {t:'signal', to, cid, signal}       a simple-peer offer/answer/candidate for peer `to`
//   server → peer  {t:'signal', from, cid, signal}     (cid: one id per data channel attempt)
//   peer → server  {t:'relay', to, id, frame}          a request frame (base64) for peer `to`'s stage,
//   server → peer  {t:'relay-reply', id, frame|error}  used when no data channel could open
//   peer → server  {t:'telemetry', routeId, stage, …}  load progress, hop kind, frame counters
//
// Every peer of this implementation (hello `directReturn: true`) also sends, as the last stage,
//   peer → server  {t:'return', routeId, stage, frame}  a sampled Token (base64 frame) for the
//                  session's owner, one-way: the answer to a ReturnDirect step (frame.ts)

import { MeshError } from '../errors.ts';
import type { ShardRange } from '../gguf/types.ts';
import type { ServeCapability } from '../model/serve-capability.ts';

export interface PeerHello {
  t: 'hello';
  /** hex HMAC-SHA256(key = room secret, message = nonce) */
  proof: string;
  name?: string;
  backend: string;
  memoryBytes: number;
  /** what it can compute: architectures as layer ranges or whole only, weight types; the planner assigns nothing else */
  serves?: ServeCapability;
  /** where other stages reach this peer: ws://host:port/v1/frames (absent: not reachable) */
  listen?: string;
  /** http://host:port for the binary HTTP protocol */
  httpUrl?: string;
  layers?: ShardRange;
  /** browser peers: the artifact (sha256) whose shard units they hold verified, and those units */
  artifact?: string;
  units?: string[];
  /** browser peers: the WebGPU adapter */
  adapter?: unknown;
  /** a native node that answers and opens WebRTC data channels (browser peers always do) */
  rtc?: boolean;
  /** takes FrameFlag.ReturnDirect and, as the last stage, sends the token to the server as a `return` message */
  directReturn?: boolean;
  /** its own measured speed (peer/calibrate.ts), for the planner that knows speed (route/speed-planner.ts) */
  speed?: PeerSpeed;
}

/** A peer's measured compute speed on the room's model, per layer. */
export interface PeerSpeed {
  /** one decode step (one token) through one layer (ms) */
  decodeMsPerLayer: number;
  /** prefill: one token through one layer, in a 16-token chunk (ms) */
  prefillMsPerTokenLayer: number;
  /** 'calibration' at join; 'steps' from the stage's live decode steps */
  source: 'calibration' | 'steps';
}

/** A speed as the server keeps it: finite, non-negative numbers only (else none). */
export function cleanSpeed(v: unknown): PeerSpeed | undefined {
  const s = v as Partial<PeerSpeed> | undefined;
  const ok = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x) && x >= 0;
  if (!s || !ok(s.decodeMsPerLayer) || !ok(s.prefillMsPerTokenLayer)) return undefined;
  return { decodeMsPerLayer: s.decodeMsPerLayer, prefillMsPerTokenLayer: s.prefillMsPerTokenLayer, source: s.source === 'steps' ? 'steps' : 'calibration' };
}

export interface ModelBrief {
  id: string;
  /** where to read the GGUF (HTTP Range), with the room secret as a Bearer token */
  url: string;
  nLayer: number;
  /** bytes of the whole artifact (all files of a split GGUF) */
  fileBytes: number;
  /** files of the artifact: 1, or the parts of a split GGUF (`url` names the first; the rest follow its name) */
  files?: number;
}

/** A STUN or TURN server as WebRTC's RTCIceServer takes it. */
export interface IceServer {
  urls: string;
  username?: string;
  credential?: string;
}

export type ServerToPeer =
  | { t: 'challenge'; nonce: string }
  /** iceServers: for browser peers that meet across the internet (absent: none configured, fine on a LAN) */
  | { t: 'welcome'; peerId: string; roomId: string; model: ModelBrief; iceServers?: IceServer[] }
  /** sources: peers that hold the shard verified and may send its bytes (browser peers ask them first, then modelUrl) */
  | { t: 'assign'; routeId: number; stage: number; shard: ShardRange; nLayer: number; modelUrl: string; downstream: string | null; downstreamPeer?: string | null; upstreamPeer?: string | null; downstreamRtc?: boolean; sources?: string[] }
  | { t: 'release'; routeId: number }
  /** a spare: load and verify this shard now, serve nothing yet; a later `assign` of the same shard takes it over at once */
  | { t: 'standby'; routeId: number; stage: number; shard: ShardRange; nLayer: number; modelUrl: string; sources?: string[] }
  /** a repair replaced a neighbour: send hidden states to a new next stage and/or accept them from a new previous one */
  | { t: 'rewire'; routeId: number; stage: number; downstream?: string | null; downstreamPeer?: string | null; downstreamRtc?: boolean; upstreamPeer?: string | null }
  /** the answer to `leave`: the peer's sessions are served elsewhere now (or could not be moved: `moved: false`); it may go */
  | { t: 'leave-ok'; moved: boolean }
  | { t: 'error'; code: string; message: string };

export type PeerToServer =
  | PeerHello
  | { t: 'ready'; routeId: number; stage: number; loadMs: number; bytesRead: number }
  | { t: 'load-failed'; routeId: number; stage: number; code: string; message: string }
  /** native peers while loading: verified shard bytes so far */
  | { t: 'loading'; routeId: number; stage: number; bytesDone: number; bytesTotal: number }
  /** a spare's standby shard is loaded and verified */
  | { t: 'standby-ready'; routeId: number; stage: number; loadMs: number; bytesRead: number }
  | { t: 'standby-failed'; routeId: number; stage: number; code: string; message: string }
  /** the rewire is done: the new links are open */
  | { t: 'rewired'; routeId: number; stage: number }
  /** a graceful leave (SIGTERM, the page's Leave button): move my sessions, then answer leave-ok */
  | { t: 'leave' }
  /** the last stage's one-way token (a base64 Token frame) for the session manager: the answer to a ReturnDirect step */
  | { t: 'return'; routeId: number; stage: number; frame: string }
  /** the peer holds less than it offered: out of memory or its device lost (code), while serving or loading `stage` of `routeId` if named */
  | { t: 'memory'; memoryBytes: number; code: string; message: string; routeId?: number; stage?: number }
  /** browser peers (below): signal/relay are routed before this union is consulted */
  | { t: 'telemetry'; routeId: number; stage: number; [k: string]: unknown };

/** hex HMAC-SHA256(key = room secret, message = nonce): what a peer's hello proves the secret with. */
export async function helloProof(secret: string, nonce: string): Promise<string> {
  const enc = new TextEncoder();
  const key = await crypto.subtle.importKey('raw', enc.encode(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const mac = new Uint8Array(await crypto.subtle.sign('HMAC', key, enc.encode(nonce)));
  let hex = '';
  for (const b of mac) hex += b.toString(16).padStart(2, '0');
  return hex;
}

/**
 * Parses an ICE server as `serve --ice-server` takes it: `stun:host[:port]`, or
 * `turn:user:pass@host[:port][?transport=udp|tcp]` (also `stuns:` / `turns:`). TURN needs a
 * user and password (browsers refuse a TURN server without them); they may be %-encoded —
 * unless `minted`: the server mints each peer a short-lived credential (`serve --turn-secret`),
 * so the URL names none.
 */
export function parseIceServer(text: string, opts: { minted?: boolean } = {}): IceServer {
  const m = /^(stuns?|turns?):(?:([^:@/?]*):([^@/?]*)@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(\d{1,5}))?(\?transport=(?:udp|tcp))?$/.exec(text.trim());
  if (!m) throw new MeshError('BAD_ICE_SERVER', `'${text}' is not an ICE server (stun:host:port or turn:user:pass@host:port)`);
  const [, scheme, user, pass, host, port, query] = m;
  const isTurn = scheme!.startsWith('turn');
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) throw new MeshError('BAD_ICE_SERVER', `'${text}': port ${port} is out of range`);
  if (isTurn && opts.minted && user !== undefined) throw new MeshError('BAD_ICE_SERVER', `'${text}': --turn-secret mints the TURN credentials, so the URL names no user:password`);
  if (isTurn && !opts.minted && (user === undefined || user === '' || pass === undefined)) throw new MeshError('BAD_ICE_SERVER', `'${text}': a TURN server needs user:password@ before the host`);
  if (!isTurn && (user !== undefined || query)) throw new MeshError('BAD_ICE_SERVER', `'${text}': a STUN server takes no user, password or transport`);
  const urls = `${scheme}:${host}${port ? `:${port}` : ''}${query ?? ''}`;
  if (isTurn && opts.minted) return { urls };
  return isTurn ? { urls, username: decodeURIComponent(user!), credential: decodeURIComponent(pass!) } : { urls };
}

/** `http(s)://host/room/<id>#secret=…` → its parts (the secret stays in the fragment). */
export function parseJoinUrl(url: string): { base: string; roomId: string; secret: string | null; params: URLSearchParams } {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new MeshError('BAD_JOIN_URL', `'${url}' is not a URL (expected http(s)://host/room/<id>#secret=…)`);
  }
  const m = /\/room\/([A-Za-z0-9_.-]+)\/?$/.exec(u.pathname);
  if (!m) throw new MeshError('BAD_JOIN_URL', `'${url}' is not a room link (expected …/room/<id>#secret=…)`);
  const params = new URLSearchParams(u.hash.replace(/^#/, ''));
  return { base: `${u.protocol}//${u.host}`, roomId: m[1]!, secret: params.get('secret'), params };
}

// ---- browser peers' messages

export interface SignalToPeer {
  t: 'signal';
  to: string;
  /** connection id chosen by the offering side: one per data channel attempt */
  cid: string;
  signal: unknown;
}

export interface SignalFromPeer {
  t: 'signal';
  from: string;
  cid: string;
  signal: unknown;
}

export interface RelayRequest {
  t: 'relay';
  to: string;
  id: number;
  /** base64 of one encoded frame */
  frame: string;
}

export interface RelayReply {
  t: 'relay-reply';
  id: number;
  frame?: string;
  error?: { code: string; message: string };
}

/** Frames and bytes that crossed one carrier, by direction and frame type. */
export interface PipeCounters {
  framesSent: number;
  framesReceived: number;
  messagesSent: number;
  messagesReceived: number;
  bytesSent: number;
  bytesReceived: number;
  /** frames by type name, both directions */
  sentByType: Record<string, number>;
  receivedByType: Record<string, number>;
  /** largest message handed to the carrier (bytes) */
  largestMessage: number;
}

export function newCounters(): PipeCounters {
  return { framesSent: 0, framesReceived: 0, messagesSent: 0, messagesReceived: 0, bytesSent: 0, bytesReceived: 0, sentByType: {}, receivedByType: {}, largestMessage: 0 };
}

/** How a stage reaches its next stage: a WebRTC data channel, the server relay, a WebSocket or binary HTTP to a native node's listen address, or none (the last stage). */
export type HopKind = 'webrtc' | 'relay' | 'ws' | 'http' | 'none';

/** The ICE candidate pair a data channel runs over: candidate types host | srflx | prflx | relay. */
export interface CandidatePair {
  local: string;
  remote: string;
  /** udp or tcp */
  protocol: string;
  /** for a relay candidate: how it reaches the TURN server (udp, tcp, tls) */
  relayProtocol?: string;
}

export interface PeerTelemetry {
  t: 'telemetry';
  routeId: number;
  stage: number;
  phase: 'loading' | 'ready' | 'failed';
  load?: { doneBytes: number; totalBytes: number; fetchedBytes: number; cachedBytes: number };
  /** cached units reused / fetched, after loading */
  cache?: { hit: string[]; fetched: string[]; error: string | null };
  /** to the next stage */
  hop?: HopKind;
  /** the candidate pair of the data channel to the next stage (hop 'webrtc') */
  candidatePair?: CandidatePair | null;
  /** frames over the data channel to the next stage (upstream side) */
  downstreamChannel?: PipeCounters | null;
  /** frames over data channels from previous stages (downstream side) */
  upstreamChannels?: Record<string, PipeCounters>;
  /** frames relayed through the server to the next stage */
  relayed?: { frames: number; bytes: number };
  /** native nodes: the candidate pair of each data channel from a previous stage */
  upstreamPairs?: Record<string, CandidatePair | null>;
}

export function toBase64(bytes: Uint8Array): string {
  const B = (globalThis as { Buffer?: { from(b: Uint8Array): { toString(enc: string): string } } }).Buffer;
  if (B) return B.from(bytes).toString('base64');
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

export function fromBase64(text: string): Uint8Array {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
