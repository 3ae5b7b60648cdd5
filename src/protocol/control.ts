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
// Native nodes (hello `probesLinks`) time their frame link to other peers when asked:
//   server → peer  {t:'probe-links', id, targets}      [{peer, url}]: the peers' listen addresses
//   peer → server  {t:'links-probed', id, results}     [{peer, rttMs} | {peer, error}]
//
// Every peer of this implementation (hello `directReturn: true`) also sends, as the last stage,
//   peer → server  {t:'return', routeId, stage, frame}  a sampled Token (base64 frame) for the
//                  session's owner, one-way: the answer to a ReturnDirect step (frame.ts)

import * as v from 'valibot';
import { MeshError } from '../errors.ts';
import type { ServeCapability } from '../model/serve-capability.ts';
import { count, finiteNumber, list, parseJsonText, plainObject, text, u32, validate } from './validate.ts';

// ---- schemas: every message either side reads is parsed against one of these first (unknown
// fields are dropped, a missing or mistyped one is BAD_MESSAGE naming it)

const shardRange = v.object({ start: u32, end: u32 });
/** what a browser or Dawn adapter says about itself: a flat record of short values */
const adapterInfo = v.pipe(
  v.record(text(64), v.union([text(256), finiteNumber, v.boolean(), v.null(), list(text(64), 256)])),
  v.check((o) => Object.keys(o).length <= 32, 'an adapter description has at most 32 fields'),
);
/** a shard unit name as the manifest has them: embed, layer.N, head, global */
const unitName = v.pipe(v.string(), v.regex(/^(embed|head|global|layer\.\d{1,6})$/));
const errorCode = v.pipe(v.string(), v.regex(/^[A-Z][A-Z0-9_]{0,63}$/));
const names = list(text(64), 1024);
/** what a peer can compute (model/serve-capability.ts): architectures as ranges or whole only, weight types */
const serveCapability: v.GenericSchema<unknown, ServeCapability> = v.object({ rangeArchitectures: names, wholeModelArchitectures: names, weightTypes: names });

const msCost = v.pipe(v.number(), v.finite(), v.minValue(0));
/** A peer's measured compute speed on the room's model, per layer. */
const peerSpeed = v.object({
  /** one decode step (one token) through one layer (ms) */
  decodeMsPerLayer: msCost,
  /** prefill: one token through one layer, in a 16-token chunk (ms) */
  prefillMsPerTokenLayer: msCost,
  /** 'calibration': measured at join (peer/calibrate.ts); the server's figure from live steps is its own (signaling-server/live-speed.ts) */
  source: v.picklist(['calibration']),
});
export type PeerSpeed = v.InferOutput<typeof peerSpeed>;

export const helloSchema = v.object({
  t: v.literal('hello'),
  /** hex HMAC-SHA256(key = room secret, message = nonce) */
  proof: v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/)),
  name: v.optional(text(64)),
  backend: text(32),
  memoryBytes: count,
  /** what it can compute: architectures as layer ranges or whole only, weight types; the planner assigns nothing else */
  serves: v.optional(serveCapability),
  /** where other stages reach this peer: ws://host:port/v1/frames (absent: not reachable) */
  listen: v.optional(v.pipe(text(512), v.regex(/^wss?:\/\//))),
  /** http://host:port for the binary HTTP protocol */
  httpUrl: v.optional(v.pipe(text(512), v.regex(/^https?:\/\//))),
  layers: v.optional(shardRange),
  /** the artifact (sha256) whose shard units the peer holds verified, and those units */
  artifact: v.optional(v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/))),
  units: v.optional(list(unitName, 100_000)),
  /** the WebGPU adapter (browser peers, native peers on Dawn) */
  adapter: v.optional(v.nullable(adapterInfo)),
  /** a native node that answers and opens WebRTC data channels (browser peers always do) */
  rtc: v.optional(v.boolean()),
  /** takes FrameFlag.ReturnDirect and, as the last stage, sends the token to the server as a `return` message */
  directReturn: v.optional(v.boolean()),
  /** takes FrameFlag.Verify (speculative decoding): drops rejected drafts and, as the last stage, answers the greedy token after each position */
  verify: v.optional(v.boolean()),
  /** takes the ring (FrameFlag.Ring, AwaitsToken): as stage 0 the steps sent ahead and the ring tokens; as the last stage, given `ring` in its assignment, links to stage 0 and sends them */
  ring: v.optional(v.boolean()),
  /** its own measured speed (peer/calibrate.ts), for the planner that knows speed (route/speed-planner.ts) */
  speed: v.optional(peerSpeed),
  /** measures its round trip to other peers' listen addresses when asked (`probe-links`) */
  probesLinks: v.optional(v.boolean()),
});
export type PeerHello = v.InferOutput<typeof helloSchema>;

const counters = v.object({
  framesSent: count,
  framesReceived: count,
  messagesSent: count,
  messagesReceived: count,
  bytesSent: count,
  bytesReceived: count,
  sentByType: v.record(text(32), count),
  receivedByType: v.record(text(32), count),
  largestMessage: count,
});
/** Frames and bytes that crossed one carrier, by direction and frame type. */
export type PipeCounters = v.InferOutput<typeof counters>;

const hopKind = v.picklist(['webrtc', 'relay', 'ws', 'http', 'none']);
/** How a stage reaches its next stage: a WebRTC data channel, the server relay, a WebSocket or binary HTTP to a native node's listen address, or none (the last stage). */
export type HopKind = v.InferOutput<typeof hopKind>;

const candidatePair = v.object({
  local: text(32),
  remote: text(32),
  /** udp or tcp */
  protocol: text(16),
  /** for a relay candidate: how it reaches the TURN server (udp, tcp, tls) */
  relayProtocol: v.optional(text(16)),
  /** the pair's round trip as ICE measured it (its STUN checks over the same path as the frames), when the browser reports one */
  rttMs: v.optional(msCost),
});
/** The ICE candidate pair a data channel runs over: candidate types host | srflx | prflx | relay. */
export type CandidatePair = v.InferOutput<typeof candidatePair>;

export const telemetrySchema = v.object({
  t: v.literal('telemetry'),
  routeId: u32,
  stage: u32,
  phase: v.picklist(['loading', 'ready', 'failed']),
  load: v.optional(v.object({ doneBytes: count, totalBytes: count, fetchedBytes: count, cachedBytes: count })),
  /** cached units reused / fetched, after loading */
  cache: v.optional(v.object({ hit: list(unitName, 100_000), fetched: list(unitName, 100_000), error: v.nullable(text(512)) })),
  /** to the next stage */
  hop: v.optional(hopKind),
  /** the candidate pair of the data channel to the next stage (hop 'webrtc') */
  candidatePair: v.optional(v.nullable(candidatePair)),
  /** frames over the data channel to the next stage (upstream side) */
  downstreamChannel: v.optional(v.nullable(counters)),
  /** frames over data channels from previous stages (downstream side) */
  upstreamChannels: v.optional(v.pipe(v.record(text(64), counters), v.check((o) => Object.keys(o).length <= 64, 'at most 64 channels'))),
  /** frames relayed through the server to the next stage */
  relayed: v.optional(v.object({ frames: count, bytes: count })),
  /** native nodes: the candidate pair of each data channel from a previous stage */
  upstreamPairs: v.optional(v.pipe(v.record(text(64), v.nullable(candidatePair)), v.check((o) => Object.keys(o).length <= 64, 'at most 64 channels'))),
});
export type PeerTelemetry = v.InferOutput<typeof telemetrySchema>;

/** The most bytes of one frame relayed as base64 through the server (the peer socket takes 64 MiB). */
const MAX_RELAYED_BASE64 = 48 * 1024 * 1024;
/** A returned Token frame is one row of at most 42 values; an Error frame a short JSON body. */
const MAX_RETURN_BASE64 = 64 * 1024;
/** Most peers one `probe-links` names (a room's other listening peers). */
export const MAX_PROBED_LINKS = 64;
const base64 = (max: number) => v.pipe(v.string(), v.maxLength(max), v.regex(/^[A-Za-z0-9+/]*={0,2}$/));

/** Every message a peer may send the server, by `t` (the fuzzer in test/hardening walks this). */
export const PEER_MESSAGES = {
  hello: helloSchema,
  /** ring: the last stage linked to stage 0 as its assignment's `ring` asked */
  ready: v.object({ t: v.literal('ready'), routeId: u32, stage: u32, loadMs: v.pipe(finiteNumber, v.minValue(0)), bytesRead: count, ring: v.optional(v.boolean()) }),
  'load-failed': v.object({ t: v.literal('load-failed'), routeId: u32, stage: u32, code: errorCode, message: text(4096) }),
  /** native peers while loading: verified shard bytes so far */
  loading: v.object({ t: v.literal('loading'), routeId: u32, stage: u32, bytesDone: count, bytesTotal: count }),
  telemetry: telemetrySchema,
  /** a spare's standby shard is loaded and verified */
  'standby-ready': v.object({ t: v.literal('standby-ready'), routeId: u32, stage: u32, loadMs: v.pipe(finiteNumber, v.minValue(0)), bytesRead: count }),
  'standby-failed': v.object({ t: v.literal('standby-failed'), routeId: u32, stage: u32, code: errorCode, message: text(4096) }),
  /** the rewire is done: the new links are open */
  rewired: v.object({ t: v.literal('rewired'), routeId: u32, stage: u32 }),
  /** a graceful leave (SIGTERM, the page's Leave button): move my sessions, then answer leave-ok */
  leave: v.object({ t: v.literal('leave') }),
  /** the peer holds less than it offered: out of memory or its device lost (code), while serving or loading `stage` of `routeId` if named */
  memory: v.object({ t: v.literal('memory'), memoryBytes: count, code: errorCode, message: text(4096), routeId: v.optional(u32), stage: v.optional(u32) }),
  /** the answer to `probe-links`: the round trip to each target (the fastest of a few Status frames), or why none was measured */
  'links-probed': v.object({ t: v.literal('links-probed'), id: u32, results: list(v.object({ peer: text(64), rttMs: v.optional(msCost), error: v.optional(text(512)) }), MAX_PROBED_LINKS) }),
  /** the last stage's one-way answer (a base64 Token or Error frame) for the session manager: the answer to a ReturnDirect step */
  return: v.object({ t: v.literal('return'), routeId: u32, stage: u32, frame: base64(MAX_RETURN_BASE64) }),
  /** a simple-peer offer/answer/candidate for peer `to` (cid: one id per data channel attempt) */
  signal: v.object({ t: v.literal('signal'), to: text(64), cid: text(64), signal: plainObject }),
  /** a request frame (base64) for peer `to`'s stage, used when no data channel could open */
  relay: v.object({ t: v.literal('relay'), to: text(64), id: u32, frame: base64(MAX_RELAYED_BASE64) }),
  /**
   * a spot check (public rooms): the last row of hidden states after the untrusted stages, as the
   * trusted first stage computed it again ('expected') or as the trusted last stage received it
   * ('actual'); f32 little-endian, base64
   */
  check: v.object({ t: v.literal('check'), routeId: u32, sessionId: v.pipe(v.string(), v.regex(/^[0-9a-f]{32}$/)), position: u32, nTokens: u32, role: v.picklist(['expected', 'actual']), row: base64(4 * 65536 * 2) }),
} as const;

export type PeerToServer = v.InferOutput<(typeof PEER_MESSAGES)['hello' | 'ready' | 'load-failed' | 'loading' | 'telemetry' | 'check' | 'standby-ready' | 'standby-failed' | 'rewired' | 'leave' | 'return' | 'memory' | 'links-probed']>;
export type LinksProbed = v.InferOutput<(typeof PEER_MESSAGES)['links-probed']>;
export type SpotCheckReport = v.InferOutput<(typeof PEER_MESSAGES)['check']>;
export type SignalToPeer = v.InferOutput<(typeof PEER_MESSAGES)['signal']>;
export type RelayRequest = v.InferOutput<(typeof PEER_MESSAGES)['relay']>;
export type PeerMessage = PeerToServer | SignalToPeer | RelayRequest;

const modelBrief = v.object({
  id: text(256),
  /** where to read the GGUF (HTTP Range), with the room secret as a Bearer token */
  url: v.pipe(text(4096), v.regex(/^https?:\/\//)),
  nLayer: u32,
  /** bytes of the whole artifact (all files of a split GGUF) */
  fileBytes: count,
  /** files of the artifact: 1, or the parts of a split GGUF (`url` names the first; the rest follow its name) */
  files: v.optional(u32),
});
export type ModelBrief = v.InferOutput<typeof modelBrief>;

const iceServer = v.object({ urls: text(1024), username: v.optional(text(512)), credential: v.optional(text(512)) });
/** A STUN or TURN server as WebRTC's RTCIceServer takes it. */
export type IceServer = v.InferOutput<typeof iceServer>;
const peerId = v.nullish(text(64));

/** Every message the server may send a peer, by `t`. */
export const SERVER_MESSAGES = {
  challenge: v.object({ t: v.literal('challenge'), nonce: v.pipe(v.string(), v.regex(/^[0-9a-f]{16,128}$/)) }),
  /** iceServers: for browser peers that meet across the internet (absent: none configured, fine on a LAN) */
  welcome: v.object({ t: v.literal('welcome'), peerId: text(64), roomId: text(64), model: modelBrief, iceServers: v.optional(list(iceServer, 16)) }),
  assign: v.object({
    t: v.literal('assign'),
    routeId: u32,
    stage: u32,
    shard: shardRange,
    nLayer: u32,
    modelUrl: v.pipe(text(4096), v.regex(/^https?:\/\//)),
    downstream: v.nullable(v.pipe(text(512), v.regex(/^wss?:\/\//))),
    downstreamPeer: peerId,
    upstreamPeer: peerId,
    /** the next stage is a native node that answers WebRTC (a tab opens a data channel to it) */
    downstreamRtc: v.optional(v.boolean()),
    /** peers that hold the shard verified and may send its bytes (browser peers ask them first, then modelUrl) */
    sources: v.optional(list(text(64), 64)),
    /** public rooms, the first stage: also load these layers (the untrusted stages') and re-run a fraction of sessions through them */
    check: v.optional(v.object({ shard: shardRange, fraction: v.pipe(v.number(), v.minValue(0), v.maxValue(1)) })),
    /** the last stage of a ring route: stage 0's listen address and peer, to send each Ring step's token to */
    ring: v.optional(v.object({ listen: v.pipe(text(512), v.regex(/^wss?:\/\//)), peer: text(64) })),
  }),
  /** public rooms, the last stage: report what arrives for this session ('actual' checks) */
  watch: v.object({ t: v.literal('watch'), routeId: u32, sessionId: v.pipe(v.string(), v.regex(/^[0-9a-f]{32}$/)) }),
  release: v.object({ t: v.literal('release'), routeId: u32 }),
  /** a spare: load and verify this shard now, serve nothing yet; a later `assign` of the same shard takes it over at once */
  standby: v.object({ t: v.literal('standby'), routeId: u32, stage: u32, shard: shardRange, nLayer: u32, modelUrl: v.pipe(text(4096), v.regex(/^https?:\/\//)), sources: v.optional(list(text(64), 64)) }),
  /** a repair replaced a neighbour: send hidden states to a new next stage and/or accept them from a new previous one */
  rewire: v.object({
    t: v.literal('rewire'),
    routeId: u32,
    stage: u32,
    downstream: v.optional(v.nullable(v.pipe(text(512), v.regex(/^wss?:\/\//)))),
    downstreamPeer: v.optional(peerId),
    downstreamRtc: v.optional(v.boolean()),
    upstreamPeer: v.optional(peerId),
  }),
  /** measure the round trip to each of these peers' listen addresses (hello `probesLinks`); answered by `links-probed` with the same id */
  'probe-links': v.object({ t: v.literal('probe-links'), id: u32, targets: list(v.object({ peer: text(64), url: v.pipe(text(512), v.regex(/^wss?:\/\//)) }), MAX_PROBED_LINKS) }),
  /** the answer to `leave`: the peer's sessions are served elsewhere now (or could not be moved: `moved: false`); it may go */
  'leave-ok': v.object({ t: v.literal('leave-ok'), moved: v.boolean() }),
  error: v.object({ t: v.literal('error'), code: errorCode, message: text(4096) }),
  signal: v.object({ t: v.literal('signal'), from: text(64), cid: text(64), signal: plainObject }),
  'relay-reply': v.object({ t: v.literal('relay-reply'), id: u32, frame: v.optional(base64(MAX_RELAYED_BASE64)), error: v.optional(v.object({ code: errorCode, message: text(4096) })) }),
} as const;

export type ServerToPeer = v.InferOutput<(typeof SERVER_MESSAGES)['challenge' | 'welcome' | 'assign' | 'release' | 'error' | 'watch' | 'standby' | 'rewire' | 'leave-ok' | 'probe-links']>;
export type ProbeLinks = v.InferOutput<(typeof SERVER_MESSAGES)['probe-links']>;
export type SignalFromPeer = v.InferOutput<(typeof SERVER_MESSAGES)['signal']>;
export type RelayReply = v.InferOutput<(typeof SERVER_MESSAGES)['relay-reply']>;
export type ServerMessage = ServerToPeer | SignalFromPeer | RelayReply;

/** Largest control message text (characters); relayed frames make the largest ones. */
export const MAX_CONTROL_TEXT = MAX_RELAYED_BASE64 + 4096;

function parseBy<T>(table: Record<string, v.GenericSchema<unknown, unknown>>, input: unknown, side: string): T {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) throw new MeshError('BAD_MESSAGE', `${side} control message: expected an object, got ${input === null ? 'null' : Array.isArray(input) ? 'an array' : typeof input}`, { field: '(whole)' });
  const t = (input as { t?: unknown }).t;
  const schema = typeof t === 'string' && Object.hasOwn(table, t) ? table[t] : undefined;
  if (!schema) throw new MeshError('BAD_MESSAGE', `${side} control message: unknown type t=${JSON.stringify(t)?.slice(0, 40)} (known: ${Object.keys(table).join(', ')})`, { field: 't' });
  return validate(schema, input, `${side} control message '${t as string}'`) as T;
}

/** A peer's control message (JSON text, or already parsed), checked against its schema. */
export function parsePeerMessage(input: string | unknown, maxChars = MAX_CONTROL_TEXT): PeerMessage {
  return parseBy(PEER_MESSAGES, typeof input === 'string' ? parseJsonText(input, maxChars, 'peer control message') : input, 'peer');
}

/** A server's control message (JSON text, or already parsed), checked against its schema. */
export function parseServerMessage(input: string | unknown): ServerMessage {
  return parseBy(SERVER_MESSAGES, typeof input === 'string' ? parseJsonText(input, MAX_CONTROL_TEXT, 'server control message') : input, 'server');
}

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

export function newCounters(): PipeCounters {
  return { framesSent: 0, framesReceived: 0, messagesSent: 0, messagesReceived: 0, bytesSent: 0, bytesReceived: 0, sentByType: {}, receivedByType: {}, largestMessage: 0 };
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
