// JSON control messages between a peer and the signaling server, sent as WebSocket text
// messages on the peer's control connection (binary messages on the same socket are frames:
// session open/close/status from the server to the stage). The secret never crosses the
// wire: the peer proves it with an HMAC of the server's nonce.

import { createHmac } from 'node:crypto';
import type { ShardRange } from '../backends/types.ts';

export interface PeerHello {
  t: 'hello';
  /** hex HMAC-SHA256(key = room secret, message = nonce) */
  proof: string;
  name?: string;
  backend: string;
  memoryBytes: number;
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
  | { t: 'assign'; routeId: number; stage: number; shard: ShardRange; nLayer: number; modelUrl: string; downstream: string | null; downstreamPeer?: string | null; upstreamPeer?: string | null }
  | { t: 'release'; routeId: number }
  | { t: 'error'; code: string; message: string };

export type PeerToServer =
  | PeerHello
  | { t: 'ready'; routeId: number; stage: number; loadMs: number; bytesRead: number }
  | { t: 'load-failed'; routeId: number; stage: number; code: string; message: string }
  /** native peers while loading: verified shard bytes so far */
  | { t: 'loading'; routeId: number; stage: number; bytesDone: number; bytesTotal: number }
  /** browser peers (src/peer/messages.ts): signal/relay are routed before this union is consulted */
  | { t: 'telemetry'; routeId: number; stage: number; [k: string]: unknown };

export function helloProof(secret: string, nonce: string): string {
  return createHmac('sha256', secret).update(nonce).digest('hex');
}

/**
 * Parses an ICE server as `serve --ice-server` takes it: `stun:host[:port]`, or
 * `turn:user:pass@host[:port][?transport=udp|tcp]` (also `stuns:` / `turns:`). TURN needs a
 * user and password (browsers refuse a TURN server without them); they may be %-encoded.
 */
export function parseIceServer(text: string): IceServer {
  const m = /^(stuns?|turns?):(?:([^:@/?]*):([^@/?]*)@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(\d{1,5}))?(\?transport=(?:udp|tcp))?$/.exec(text.trim());
  if (!m) throw new Error(`'${text}' is not an ICE server (stun:host:port or turn:user:pass@host:port)`);
  const [, scheme, user, pass, host, port, query] = m;
  const isTurn = scheme!.startsWith('turn');
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) throw new Error(`'${text}': port ${port} is out of range`);
  if (isTurn && (user === undefined || user === '' || pass === undefined)) throw new Error(`'${text}': a TURN server needs user:password@ before the host`);
  if (!isTurn && (user !== undefined || query)) throw new Error(`'${text}': a STUN server takes no user, password or transport`);
  const urls = `${scheme}:${host}${port ? `:${port}` : ''}${query ?? ''}`;
  return isTurn ? { urls, username: decodeURIComponent(user!), credential: decodeURIComponent(pass!) } : { urls };
}

/** Parses a room URL `http://host:port/room/<id>#secret=<s>` into its parts. */
export function parseRoomUrl(url: string): { base: string; roomId: string; secret?: string } {
  const u = new URL(url);
  const m = /\/room\/([A-Za-z0-9_.-]+)\/?$/.exec(u.pathname);
  if (!m) throw new Error(`'${url}' is not a room URL (expected …/room/<id>)`);
  const secret = new URLSearchParams(u.hash.replace(/^#/, '')).get('secret') ?? undefined;
  return { base: `${u.protocol}//${u.host}`, roomId: m[1]!, ...(secret ? { secret } : {}) };
}

/** Parses sizes like 4GiB, 512MiB, 1.5GB, 1000000. */
export function parseBytes(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$/i.exec(text);
  if (!m) throw new Error(`'${text}' is not a size (e.g. 4GiB, 512MiB)`);
  const unit = (m[2] ?? '').toUpperCase();
  const pow = { '': 0, B: 0, K: 1, KB: 1, KIB: 1, M: 2, MB: 2, MIB: 2, G: 3, GB: 3, GIB: 3, T: 4, TB: 4, TIB: 4 }[unit];
  if (pow === undefined) throw new Error(`'${text}': unknown unit ${m[2]}`);
  const base = unit.includes('I') || unit.length === 1 ? 1024 : 1000;
  return Math.round(Number(m[1]) * base ** pow);
}
