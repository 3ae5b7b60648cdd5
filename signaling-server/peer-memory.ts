// What the planner may put on a peer: the memory its hello offered, lowered when the peer says
// it measured less (a tab after an out-of-memory error or a lost device), and kept below the
// smallest shard that already failed on it for want of memory — so a re-plan never hands the
// same range (or one that holds it) straight back, and every failure shrinks what the peer is
// given until it is left out: no plan–fail loop.

import type { PeerToServer } from '../src/protocol/control.ts';
import type { RoomHost } from './room-host.ts';
import type { Peer } from './room-peer.ts';

/** Load failures that mean the shard did not fit (a lost device counts: a GPU reset, a killed GPU process, a phone reclaiming memory). */
export const MEMORY_FAILURE_CODES: ReadonlySet<string> = new Set(['WEBGPU_OUT_OF_MEMORY', 'WEBGPU_DEVICE_LOST']);

export interface MemoryFacts {
  hello: { memoryBytes: number };
  /** bytes of the smallest shard that failed on this peer for want of memory */
  memoryFailedBytes?: number;
}

/** Bytes the planner and the repair may give `p`. */
export function plannedMemory(p: MemoryFacts): number {
  const offered = p.hello.memoryBytes;
  return p.memoryFailedBytes === undefined ? offered : Math.max(0, Math.min(offered, p.memoryFailedBytes - 1));
}

/** A shard of `bytes` could not be kept on `p`. */
export function noteMemoryFailure(p: MemoryFacts, bytes: number): void {
  p.memoryFailedBytes = Math.min(p.memoryFailedBytes ?? Infinity, bytes);
}

/** A peer's own lowered budget: taken only downwards (raising one needs a new hello). */
export function lowerOffer(p: MemoryFacts, memoryBytes: unknown): boolean {
  const n = Number(memoryBytes);
  if (!Number.isFinite(n) || n < 0 || n >= p.hello.memoryBytes) return false;
  p.hello.memoryBytes = Math.floor(n);
  return true;
}

/**
 * A peer measured less memory than it offered (a tab after out-of-memory or a lost device).
 * Its stage's (or standby's) shard counts as failed for want of memory; a ready stage whose
 * device is gone is lost like a peer that left (repaired, or the room replans); a loading one
 * reports load-failed, which replans.
 */
export function memoryLowered(room: RoomHost, peer: Peer, msg: Extract<PeerToServer, { t: 'memory' }>): void {
  lowerOffer(peer, msg.memoryBytes);
  const r = room.route && room.route.status !== 'closed' && room.route.id === msg.routeId ? room.route : null;
  const st = r?.stages.find((s) => s.peerId === peer.id && s.stage === msg.stage);
  const spare = room.keeper.spares.get(peer.id);
  if (st) noteMemoryFailure(peer, room.shardBytes(st.shard));
  else if (spare && r) {
    noteMemoryFailure(peer, room.shardBytes(spare.shard));
    room.keeper.spares.delete(peer.id);
  }
  room.log(`peer ${peer.id} lowered its memory to ${peer.hello.memoryBytes} bytes (${msg.code}: ${msg.message}); plans give it at most ${plannedMemory(peer)}`);
  if (st?.status === 'ready' && msg.code === 'WEBGPU_DEVICE_LOST') room.stageGone(peer, `${msg.code}: ${msg.message}`);
  else if (st?.status !== 'loading') room.schedulePlan();
}
