// The stall probe: a session step that goes unanswered past its deadline makes the route ask
// every stage for its status at once (room-route.ts suspectStall), and a stage whose peer does
// not answer in time is lost, as if it had left, so that the route's repair can take over.

import { FrameType, makeFrame } from '../src/protocol/frame.ts';
import type { Route } from './room-route.ts';
import type { Peer } from './room-peer.ts';

/** How long a stage may take to answer a status probe before a stalled step blames it (ms): a live peer answers in milliseconds. */
const STALL_PROBE_MS = 1_500;
/** How late the probe's own timer may fire before the probe counts as this server's stall, not a stage's (ms). */
const STALL_PROBE_SLACK_MS = 500;

/** What the probe needs of the room. */
export interface StalledRoom {
  readonly peers: ReadonlyMap<string, Peer>;
  log(line: string): void;
  peerGone(peer: Peer, why: string): void;
}

/**
 * Asks every stage of `r` for its status at once; one that does not answer in time is lost
 * (stalled). A live peer answers a Status at once, however busy its compute (the answer skips
 * the compute queue): only a stopped process, a frozen tab or a cut link misses it. A slow
 * control link gets longer (a few of its round trips), a peer that answered a heartbeat ping
 * meanwhile is alive (its answer is queued behind other frames), and a probe whose own timer
 * fired late (this server's event loop was held up) blames nobody.
 */
export async function probeStages(room: StalledRoom, r: Route): Promise<void> {
  const started = performance.now();
  const startedAt = Date.now();
  const late = await Promise.all(
    r.stages.map(async (st) => {
      const p = room.peers.get(st.peerId);
      if (!p || p.gone) return null;
      const ms = Math.max(STALL_PROBE_MS, 4 * (p.rttMs ?? 0));
      const t0 = performance.now();
      const ok = await Promise.race([
        p.control.request(makeFrame({ type: FrameType.Status })).then(() => true, () => true),
        new Promise<boolean>((resolve) => setTimeout(() => resolve(false), ms).unref()),
      ]);
      if (ok || (p.lastPongAt ?? 0) >= startedAt) return null;
      return performance.now() - t0 > ms + STALL_PROBE_SLACK_MS ? 'busy' : { p, ms };
    }),
  );
  if (late.includes('busy')) return room.log(`route ${r.id}: a stall probe took ${Math.round(performance.now() - started)} ms (this server was busy); nobody blamed`);
  for (const x of late) {
    if (!x || x === 'busy' || x.p.gone) continue;
    room.peerGone(x.p, `stalled: no answer to a status probe within ${Math.round(x.ms)} ms`);
    x.p.ws.terminate();
  }
}
