// Passing a peer, a client or an API request on to the instance that holds its room (cluster.ts):
// a direct link between the two instances, proven with the cluster key (INSTANCE_HEADER), never
// through Redis. A WebSocket (a peer's control socket, a client's frame socket) becomes two
// sockets joined here, message for message in order, with the holder's pings passed through to
// the peer and its pongs back — so the holder's heartbeat and round-trip estimate measure the
// peer itself, not this instance. An HTTP request is re-sent with its headers and body, and the
// answer (an SSE stream included) piped back as it comes.

import { request as httpRequest } from 'node:http';
import type { ClientRequest, IncomingMessage, ServerResponse } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { Duplex } from 'node:stream';
import WebSocket from 'ws';
import type { WebSocketServer } from 'ws';
import { MeshError } from '../src/errors.ts';
import { refuseUpgrade } from '../src/transport/frame-server.ts';
import { sendError } from '../src/transport/http.ts';
import { INSTANCE_HEADER } from './cluster.ts';
import type { InstanceRecord } from './directory.ts';

/** What this instance passed on to another, by room: ended when the room comes to this instance (the old holder is dead or frozen). */
export class RoomLinks {
  private readonly byRoom = new Map<string, Set<() => void>>();

  /** Registers a way to end a link of the room; returns its removal. */
  add(roomId: string, end: () => void): () => void {
    let set = this.byRoom.get(roomId);
    if (!set) this.byRoom.set(roomId, (set = new Set()));
    set.add(end);
    return () => set.delete(end);
  }

  endAll(roomId: string): void {
    const set = this.byRoom.get(roomId);
    if (!set) return;
    this.byRoom.delete(roomId);
    for (const end of set) end();
  }
}

/** Headers that belong to one hop (and the WebSocket handshake), not passed on. */
const HOP_HEADERS = new Set(['connection', 'upgrade', 'keep-alive', 'transfer-encoding', 'sec-websocket-key', 'sec-websocket-version', 'sec-websocket-extensions', 'sec-websocket-accept', 'proxy-connection', 'te', 'trailer']);

/** A close code the other side may be sent (1005/1006/1015 are only ever reported). */
function sendableCode(code: number): number {
  return code === 1000 || (code >= 1001 && code <= 1014 && code !== 1004 && code !== 1005 && code !== 1006) || (code >= 3000 && code <= 4999) ? code : 1012;
}

function passedHeaders(req: IncomingMessage, proof: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !HOP_HEADERS.has(k)) out[k] = Array.isArray(v) ? v.join(', ') : v;
  out[INSTANCE_HEADER] = proof;
  return out;
}

export interface LinkTrust {
  /** PEM of a CA the instances' certificates verify against (the cluster's local CA) */
  ca?: string;
}

/**
 * Joins an upgrade request to a socket on `target`: the holder answers the upgrade first (a
 * refusal there is the refusal here), then both sockets carry each other's messages until either
 * closes.
 */
export function linkUpgrade(wss: WebSocketServer, req: IncomingMessage, socket: Duplex, head: Buffer, target: InstanceRecord, proof: string, trust: LinkTrust = {}, joined?: (peer: WebSocket) => void): void {
  const url = target.url.replace(/^http/, 'ws') + (req.url ?? '/');
  const upstream = new WebSocket(url, { headers: passedHeaders(req, proof), autoPong: false, maxPayload: 64 * 1024 * 1024, handshakeTimeout: 5_000, ...(trust.ca ? { ca: trust.ca } : {}) });
  let open = false;
  upstream.once('unexpected-response', (_r, res) => {
    // the holder refused (its status and JSON error): pass the refusal on as it is
    const chunks: Buffer[] = [];
    res.on('data', (c: Buffer) => chunks.push(c));
    res.on('end', () => {
      socket.end(`HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ''}\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n${Buffer.concat(chunks).toString()}`);
    });
  });
  upstream.once('error', (e) => {
    if (!open) refuseUpgrade(socket, 'ROOM_ELSEWHERE'); // the peer's reconnect tries again, by then at the room's next holder
  });
  upstream.once('open', () => {
    open = true;
    wss.handleUpgrade(req, socket, head, (peer) => {
      join(peer, upstream);
      joined?.(peer);
    });
  });
}

function join(peer: WebSocket, upstream: WebSocket): void {
  peer.on('message', (data, isBinary) => upstream.readyState === upstream.OPEN && upstream.send(data, { binary: isBinary }));
  upstream.on('message', (data, isBinary) => peer.readyState === peer.OPEN && peer.send(data, { binary: isBinary }));
  // the holder's heartbeat reaches the peer, and the peer's answer the holder
  upstream.on('ping', (data) => peer.readyState === peer.OPEN && peer.ping(data));
  peer.on('pong', (data) => upstream.readyState === upstream.OPEN && upstream.pong(data));
  peer.on('close', (code, reason) => upstream.close(sendableCode(code), reason));
  upstream.on('close', (code, reason) => peer.close(sendableCode(code), reason.length ? reason : Buffer.from('the instance holding this room went away')));
  peer.on('error', () => upstream.terminate());
  upstream.on('error', () => peer.terminate());
}

/** `req` again, to `target`: its method, path and headers with this instance's proof, `body` in place of its own when given (the caller ends it). */
export function resend(req: IncomingMessage, target: InstanceRecord, proof: string, trust: LinkTrust, body: Buffer | undefined, onAnswer: (answer: IncomingMessage) => void): ClientRequest {
  const url = new URL(req.url ?? '/', target.url);
  const headers = passedHeaders(req, proof);
  if (body) headers['content-length'] = String(body.length);
  const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
  return send(url, { method: req.method ?? 'GET', headers, ...(trust.ca ? { ca: trust.ca } : {}) }, onAnswer);
}

/** An answer's headers, less those of its own hop. */
export function answerHeaders(answer: IncomingMessage): Record<string, string | string[]> {
  const h: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(answer.headers)) if (v !== undefined && !HOP_HEADERS.has(k)) h[k] = v;
  return h;
}

/** Re-sends an HTTP request to `target` and pipes its answer back; `body`: the body already read here (else the request's stream is piped). */
export function linkRequest(req: IncomingMessage, res: ServerResponse, target: InstanceRecord, proof: string, body?: Buffer, trust: LinkTrust = {}, links?: { roomId: string; all: RoomLinks }): Promise<void> {
  return new Promise((resolve) => {
    const out = resend(req, target, proof, trust, body, (answer) => {
      const h = answerHeaders(answer);
      res.writeHead(answer.statusCode ?? 502, h);
      answer.pipe(res);
      answer.on('end', resolve);
      answer.on('error', () => (res.destroy(), resolve()));
    });
    out.on('error', (e) => {
      if (!res.headersSent) sendError(res, new MeshError('ROOM_ELSEWHERE', `the instance holding this room (${target.url}) cannot be reached: ${e.message}`, { retryAfterS: 1 }));
      else res.destroy();
      resolve();
    });
    // the client left: so does the request on the holder (a streamed completion stops there)
    res.on('close', () => {
      if (!res.writableFinished) out.destroy();
    });
    // the room came here (its holder died or froze): the request ends as a refusal the client may retry
    const remove = links?.all.add(links.roomId, () => out.destroy(new MeshError('ROOM_ELSEWHERE', 'the room moved to another instance')));
    if (remove) res.on('close', remove);
    if (body) out.end(body);
    else req.pipe(out);
  });
}
