// Who may be a stage: a room's policy for sites whose visitors donate compute. A visitor who
// leaves after a minute never repays its shard's download and its stage must be repaired, so a
// peer becomes a stage only once it has stayed `minStayMs` — at once if it already holds a
// verified shard of this artifact (nothing to fetch) — and only with at least
// `minMemoryBytes` to give. Until then it is a spare: it warms up a standby shard, which makes
// it a ready replacement, and it chats like any client.

import { plannedMemory } from './peer-memory.ts';
import type { RoomHost } from './room-host.ts';
import type { Peer } from './room-peer.ts';

export interface StagePolicy {
  /** a peer joins routes only after this long in the room (ms; 0 = at once) */
  minStayMs: number;
  /** a peer joins routes only with at least this much memory to give (bytes) */
  minMemoryBytes: number;
}

export const OPEN_POLICY: StagePolicy = { minStayMs: 0, minMemoryBytes: 0 };

export interface StageCandidate {
  joinedAt: number;
  /** bytes the planner may give it (peer-memory.ts) */
  memoryBytes: number;
  /** it holds a verified shard of this artifact */
  holdsShard: boolean;
}

/** 0 when the peer may be a stage now; else how long until it may (ms), or Infinity when its memory never allows. */
export function waitBeforeStage(policy: StagePolicy, c: StageCandidate, now = Date.now()): number {
  if (c.memoryBytes < policy.minMemoryBytes) return Infinity;
  if (c.holdsShard) return 0;
  return Math.max(0, c.joinedAt + policy.minStayMs - now);
}

/** Peers of `room` that may take a stage now; a replan is scheduled for when the next newcomer may. */
export function stageCandidates(room: RoomHost, policy: StagePolicy): Peer[] {
  let next = Infinity;
  const out = [...room.peers.values()].filter((p) => {
    if (!room.keeper.eligible(p)) return false;
    const wait = waitBeforeStage(policy, { joinedAt: p.joinedAt, memoryBytes: plannedMemory(p), holdsShard: room.heldRangeOf(p) !== undefined });
    if (wait > 0) next = Math.min(next, wait);
    return wait === 0;
  });
  if (Number.isFinite(next)) setTimeout(() => room.schedulePlan(), next + 10).unref();
  return out;
}
