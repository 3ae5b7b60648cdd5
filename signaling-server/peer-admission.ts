// A peer's control socket, from challenge to leaving: the server sends a nonce; the first
// message must be a hello whose proof (HMAC of the nonce under the room secret) matches, and
// nothing else is read until it is verified and the peer admitted (welcome). After that the
// peer's messages go to the browser-peer router (signals, relays) or to its room.

import { randomBytes } from 'node:crypto';
import type WebSocket from 'ws';
import { MeshError } from '../src/errors.ts';
import { helloProof, parsePeerMessage } from '../src/protocol/control.ts';
import type { PeerHello, PeerMessage } from '../src/protocol/control.ts';
import { secretMatches } from '../src/transport/frame-server.ts';
import { handleBrowserPeerMessage } from './browser-peers.ts';
import { notePong } from './live-speed.ts';
import type { BrowserPeerRoom, RelayLedger } from './browser-peers.ts';
import type { Room } from './room.ts';
import type { Peer } from './room-peer.ts';

/** How long a new socket may take to prove the secret. */
const HELLO_TIMEOUT_MS = 10_000;
/** Largest message read before the peer proved the secret (a hello is a few KiB). */
const MAX_HELLO_TEXT = 256 * 1024;

/** Liveness of an admitted peer: a WebSocket ping every `heartbeatMs`; no pong for `heartbeatTimeoutMs` and the peer is lost. */
export interface Liveness {
  heartbeatMs: number;
  heartbeatTimeoutMs: number;
}

export const DEFAULT_LIVENESS: Liveness = { heartbeatMs: 500, heartbeatTimeoutMs: 3_500 };

/**
 * Pings the peer's socket; a peer that stops answering (a stopped process, a frozen tab, a
 * cut link — the socket may stay open for minutes) is lost like one that closed.
 */
function watchLiveness(room: Room, peer: Peer, ws: WebSocket, l: Liveness): () => void {
  let lastPong = Date.now();
  ws.on('pong', (data: Buffer) => {
    lastPong = peer.lastPongAt = Date.now();
    // the planner's link estimate: the control socket's round trip (live-speed.ts). Each ping
    // carries its send time (this process's performance.now(), sub-millisecond) and the pong
    // echoes it (RFC 6455), so a round trip longer than the ping interval is measured whole,
    // not against the latest ping
    const sentAt = Number(data.toString());
    const now = performance.now();
    if (!(sentAt > 0) || sentAt > now) return;
    notePong(peer, now - sentAt);
  });
  const timer = setInterval(() => {
    const silent = Date.now() - lastPong;
    if (silent > l.heartbeatTimeoutMs) {
      clearInterval(timer);
      room.peerGone(peer, `no heartbeat for ${(silent / 1000).toFixed(1)} s (stopped or unreachable)`);
      ws.terminate();
      return;
    }
    if (ws.readyState === ws.OPEN) ws.ping(performance.now().toFixed(3));
  }, l.heartbeatMs);
  timer.unref();
  return () => clearInterval(timer);
}

/** The room as the browser-peer router sees it. */
function browserPeerView(room: Room): BrowserPeerRoom {
  return {
    sendTo: (id, m) => {
      const to = room.peers.get(id);
      if (!to) return false;
      room.send(to, m as never);
      return true;
    },
    controlOf: (id) => room.peers.get(id)?.control ?? null,
    // relayed frames may only go from a stage to the next stage of the current route
    nextStageOf: (id) => {
      const st = room.route?.stages.find((x) => x.peerId === id);
      return st ? (room.route!.stages[st.stage + 1]?.peerId ?? null) : null;
    },
  };
}

/** `text` cut to the 123 bytes a WebSocket close reason may carry (on a character boundary). */
function closeReason(text: string): string {
  let out = text;
  while (Buffer.byteLength(out) > 123) out = out.slice(0, -1);
  return out;
}

/**
 * Runs the challenge on a new peer socket of `room`, then serves the admitted peer's messages.
 * `reach.origin`: where the peer reached this server (it reads a hosted model there);
 * `reach.reachedAt`: the address of this machine its connection reached (where its STUN is).
 */
export function admitPeer(room: Room, ws: WebSocket, ledger: RelayLedger, reach: { origin?: string; reachedAt?: string } = {}, liveness: Liveness = DEFAULT_LIVENESS): void {
  const nonce = randomBytes(16).toString('hex');
  const expectedProof = helloProof(room.secret, nonce);
  // a public room's trusted peers prove the trusted secret instead
  const trustedProof = room.trustedSecret ? helloProof(room.trustedSecret, nonce) : Promise.resolve(null);
  const view = browserPeerView(room);
  let peer: Peer | null = null;
  let helloSeen = false;
  let stopWatching = (): void => undefined;
  const refuse = (code: string, message: string): void => {
    room.log(`refused a peer socket: ${code}: ${message}`);
    ws.send(JSON.stringify({ t: 'error', code, message }));
    // the reason names why too: a peer that reads its messages late sees the close first
    ws.close(4401, closeReason(`${code}: ${message}`));
  };
  const helloTimer = setTimeout(() => !peer && refuse('HELLO_TIMEOUT', `no hello within ${HELLO_TIMEOUT_MS / 1000} s`), HELLO_TIMEOUT_MS);
  helloTimer.unref();
  // an admitted peer's bad message is answered and dropped; before admission it ends the socket
  const onAdmitted = (p: Peer, text: string): void => {
    let msg: PeerMessage;
    try {
      msg = parsePeerMessage(text);
    } catch (e) {
      const err = e as MeshError;
      room.log(`peer ${p.id}: ${err.message}`);
      return room.send(p, { t: 'error', code: err.code, message: err.message });
    }
    if (msg.t === 'hello') return room.send(p, { t: 'error', code: 'BAD_MESSAGE', message: 'already admitted: a second hello is not read' });
    if (msg.t === 'signal' || msg.t === 'relay') handleBrowserPeerMessage(view, p.id, msg, (m) => room.send(p, m as never), ledger);
    else room.onPeerMessage(p, msg);
  };
  const onHello = (text: string): void => {
    // until welcome, the hello (once) is the only message read; its proof is checked before admission
    const msg = parsePeerMessage(text, MAX_HELLO_TEXT);
    if (msg.t !== 'hello' || helloSeen) throw new MeshError('BAD_MESSAGE', 'the first message must be hello, and the only one until welcome');
    helloSeen = true;
    const { proof: presented, ...offer } = msg;
    void Promise.all([expectedProof, trustedProof]).then(([proof, trusted]) => {
      const isTrusted = trusted !== null && secretMatches(presented, trusted);
      if (!isTrusted && !secretMatches(presented, proof)) return refuse('AUTH_FAILED', 'wrong room secret');
      if (ws.readyState !== ws.OPEN) return;
      clearTimeout(helloTimer);
      const hello: PeerHello = { ...offer, proof: '' };
      peer = room.addPeer(hello, ws, { trusted: isTrusted, ...reach });
      stopWatching = watchLiveness(room, peer, ws, liveness);
    });
  };
  ws.on('message', (data, isBinary) => {
    if (isBinary) return; // frame replies: the peer's WsLink reads them
    const text = data.toString();
    try {
      if (peer) onAdmitted(peer, text);
      else onHello(text);
    } catch (e) {
      const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
      if (peer) room.log(`peer ${peer.id}: message handler failed: ${err.message}`);
      else refuse(err.code, err.message);
    }
  });
  ws.on('close', () => {
    clearTimeout(helloTimer);
    stopWatching();
    if (peer) room.peerGone(peer, 'connection closed');
  });
  ws.send(JSON.stringify({ t: 'challenge', nonce }));
}
