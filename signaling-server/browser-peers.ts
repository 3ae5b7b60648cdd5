// The signaling server's half of the browser-peer messages (src/peer/messages.ts): forward
// WebRTC signals between two peers of a room, relay request frames to a peer's stage when no
// data channel opened, and keep each stage's telemetry. Written against a narrow view of a
// room so the server wires it in with a few lines.

import type { FrameLink } from '../src/transport/link.ts';
import { MeshError } from '../src/errors.ts';
import { decodeFrame, encodeFrame, FrameType } from '../src/protocol/frame.ts';
import { fromBase64, toBase64 } from '../src/protocol/control.ts';
import type { PeerMessage, RelayReply, RelayRequest, SignalToPeer } from '../src/protocol/control.ts';

export interface BrowserPeerRoom {
  /** send a JSON control message to peer `id`; false when it is not in the room */
  sendTo(id: string, msg: unknown): boolean;
  /** peer `id`'s control link (frames to its stage) */
  controlOf(id: string): FrameLink | null;
  /** the peer serving the stage after `id`'s in the current route (relays go only there) */
  nextStageOf(id: string): string | null;
}

/** Relayed frames per `from->to` pair, kept per room. */
export type RelayLedger = Map<string, RelayCounters>;

/**
 * Handles signal and relay messages from peer `from`; returns false for any other message
 * (the caller's own handling applies). Replies go back through `reply`.
 */
export function handleBrowserPeerMessage(room: BrowserPeerRoom, from: string, msg: PeerMessage | { t: string }, reply: (m: unknown) => void, ledger: RelayLedger): boolean {
  if (msg.t === 'signal') {
    const m = msg as SignalToPeer;
    room.sendTo(m.to, { t: 'signal', from, cid: m.cid, signal: m.signal });
    return true;
  }
  if (msg.t === 'relay') {
    void relayThroughRoom(room, from, msg as RelayRequest, ledger).then(reply);
    return true;
  }
  return false;
}

/** What the server side needs from a room. */
export interface RelayRoom {
  /** the control link of peer `id` (frames to its stage), or null when it is not in the room */
  controlOf(id: string): FrameLink | null;
  /** the peer serving the stage after `id`'s in the current route */
  nextStageOf(id: string): string | null;
}

export interface RelayCounters {
  frames: number;
  bytes: number;
}

/**
 * Server side: passes one relay request to the target peer's stage and answers with its reply.
 * Counts what it relayed in `counters` (per sending peer → target).
 */
export async function relayThroughRoom(room: RelayRoom, from: string, m: RelayRequest, counters: Map<string, RelayCounters>): Promise<RelayReply> {
  try {
    const link = room.controlOf(m.to);
    if (!link) throw new MeshError('STAGE_UNREACHABLE', `peer ${m.to} is not in this room`);
    // a stage passes hidden states to its next stage, nothing else: the relay carries no more
    if (room.nextStageOf(from) !== m.to) throw new MeshError('RELAY_REFUSED', `peer ${from} does not serve the stage before ${m.to}'s`);
    const bytes = fromBase64(m.frame);
    const frame = decodeFrame(bytes);
    if (frame.type !== FrameType.Hidden) throw new MeshError('RELAY_REFUSED', `only Hidden frames are relayed between stages, not ${FrameType[frame.type]}`);
    const key = `${from}->${m.to}`;
    const c = counters.get(key) ?? { frames: 0, bytes: 0 };
    c.frames++;
    c.bytes += bytes.byteLength;
    counters.set(key, c);
    const reply = await link.request(frame);
    return { t: 'relay-reply', id: m.id, frame: toBase64(encodeFrame(reply)) };
  } catch (e) {
    const err = e instanceof MeshError ? e : new MeshError('RELAY_FAILED', (e as Error).message);
    return { t: 'relay-reply', id: m.id, error: { code: err.code, message: err.message } };
  }
}
