// The signaling server's half of the browser-peer messages (src/peer/messages.ts): forward
// WebRTC signals between two peers of a room, relay request frames to a peer's stage when no
// data channel opened, and keep each stage's telemetry. Written against a narrow view of a
// room so the server wires it in with a few lines.

import type { FrameLink } from '../transport/link.ts';
import { relayThroughRoom } from './relay.ts';
import type { RelayCounters } from './relay.ts';
import type { RelayRequest, SignalToPeer } from './messages.ts';

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
export function handleBrowserPeerMessage(room: BrowserPeerRoom, from: string, msg: { t: string }, reply: (m: unknown) => void, ledger: RelayLedger): boolean {
  if (msg.t === 'signal') {
    const m = msg as SignalToPeer;
    room.sendTo(String(m.to), { t: 'signal', from, cid: String(m.cid), signal: m.signal });
    return true;
  }
  if (msg.t === 'relay') {
    void relayThroughRoom(room, from, msg as RelayRequest, ledger).then(reply);
    return true;
  }
  return false;
}
