// A peer of a room as the server holds it: its hello, its control socket, and what the room has
// learnt of it since (excluded, leaving, trusted, its round trip and live speed, a memory failure). The room and
// its helpers share this shape; it knows nothing of routes or rooms.

import type WebSocket from 'ws';
import type { PeerHello } from '../src/protocol/control.ts';
import type { WsLink } from '../src/transport/ws.ts';

export interface Peer {
  id: string;
  hello: PeerHello;
  ws: WebSocket;
  /** frames to the peer's stage over its control socket */
  control: WsLink;
  joinedAt: number;
  gone: boolean;
  /** the origin the peer reached the server at (https://host:port), when known */
  origin?: string;
  /** refused its shard's bytes (hash mismatch), or failed a spot check: stays out of routes for this artifact */
  excluded?: string;
  /** asked to leave gracefully: takes no new stage or standby */
  leaving?: boolean;
  /** proved the trusted secret (public rooms: may serve the first and last stages) */
  trusted?: boolean;
  /** the control socket's round trip (ms): the least of the recent heartbeats' (live-speed.ts) */
  rttMs?: number;
  /** the recent heartbeats' round trips (ms), oldest first */
  rttWindow?: number[];
  /** the recent live decode steps' own compute per layer on this peer's stage (ms) and when (Date.now(); live-speed.ts), oldest first */
  liveDecode?: Array<{ ms: number; at: number }>;
  /** Date.now() of the last heartbeat pong: a peer that answers pings is not stopped */
  lastPongAt?: number;
  /** bytes of the smallest shard that failed here for want of memory (peer-memory.ts) */
  memoryFailedBytes?: number;
}
