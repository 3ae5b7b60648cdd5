// A public room (visitors donate compute): peers that prove the trusted secret serve the first
// and last stages — they alone see token ids and logits — and the first re-runs a fraction of
// sessions through the donors' layers. The trusted last stage reports what it received for the
// sessions it is told to watch; the two halves meet in the SpotChecker, and a disagreement
// excludes every donor between the trusted ends (the room repairs their stages like lost ones).

import type { ShardRange } from '../src/gguf/types.ts';
import type { SpotCheckReport } from '../src/protocol/control.ts';
import { SpotChecker } from './spot-check.ts';
import type { SpotCheckVerdict } from './spot-check.ts';
import type { RoomHost } from './room-host.ts';
import type { Peer } from './room-peer.ts';
import type { Route } from './room-route.ts';

export interface PublicRoomOptions {
  trustedSecret: string;
  /** share of sessions the first stage re-runs through the donors' layers (0: none) */
  fraction: number;
  /** largest ‖expected − actual‖ / ‖actual‖ of a checked row that passes */
  tolerance: number;
}

/** Sessions the last stage is watching, at most (the oldest is forgotten first). */
const MAX_WATCHED = 10_000;

export class PublicRoom {
  readonly checker: SpotChecker;
  /** sessions the last stage was told to watch */
  private readonly watching = new Set<string>();

  constructor(
    private readonly room: RoomHost,
    readonly opts: PublicRoomOptions,
  ) {
    this.checker = new SpotChecker(opts.tolerance, (v) => !v.ok && this.failed(v));
  }

  /** Whether `p` may serve stage `stage` of a route of `nStages` (a plan, a spare, a repair): only trusted peers take the ends. */
  mayServe(p: Peer, stage: number, nStages: number): boolean {
    return p.trusted === true || (stage > 0 && stage < nStages - 1);
  }

  /** With checks on: the layers between the trusted ends, which the first stage re-runs. */
  checkShard(route: Route): { shard: ShardRange; fraction: number } | null {
    if (this.opts.fraction <= 0 || route.stages.length < 3) return null;
    return { shard: { start: route.stages[1]!.shard.start, end: route.stages.at(-2)!.shard.end }, fraction: this.opts.fraction };
  }

  /** One half of a spot check, from the route's trusted first or last stage only. */
  onReport(peer: Peer, msg: SpotCheckReport): void {
    const r = this.room.route;
    if (!r || r.status !== 'ready' || msg.routeId !== r.id || !peer.trusted) return;
    const first = r.stages[0]!;
    const last = r.stages.at(-1)!;
    if (msg.role === 'expected' && first.peerId !== peer.id) return;
    if (msg.role === 'actual' && last.peerId !== peer.id) return;
    if (msg.role === 'expected' && !this.watching.has(msg.sessionId)) {
      // the last stage reports only what it is asked for: the donors cannot tell which sessions are checked
      this.watching.add(msg.sessionId);
      if (this.watching.size > MAX_WATCHED) this.watching.delete(this.watching.values().next().value!);
      const lastPeer = this.room.peers.get(last.peerId);
      if (lastPeer) this.room.send(lastPeer, { t: 'watch', routeId: r.id, sessionId: msg.sessionId });
    }
    this.checker.report(msg);
  }

  /** A check failed: the untrusted stages between the trusted ends computed the difference together; all are excluded. */
  private failed(v: SpotCheckVerdict): void {
    const r = this.room.route;
    if (!r || r.id !== v.routeId) return;
    const reason = `spot check of session ${v.sessionId} at position ${v.position}: hidden states differ from a trusted re-run by ${v.error.toExponential(2)} (tolerance ${this.opts.tolerance})`;
    for (const st of r.stages.slice(1, -1)) {
      const p = this.room.peers.get(st.peerId);
      if (p && !p.trusted) this.room.excludePeer(p, reason);
    }
  }

  summary(): Record<string, unknown> {
    return { passed: this.checker.passed, failed: this.checker.failed, tolerance: this.checker.tolerance };
  }
}
