// Re-planning a speed-planned room's route once its peers' live figures (live-speed.ts) say it
// is slow: every CHECK_MS, a ready route with no session on it (kept sessions of the prefix
// cache aside: they are a cache, not a client's) is weighed again when a peer's live decode
// figure has moved by MOVED or more since the last weighing — the planner's chain for the
// figures of now (plan-choice.ts speedGain) against the route's own predicted step under the
// same figures — and re-planned when the chain is another and at least `gain` times faster
// (`serve --replan-gain`, default 1.3: noise in the figures, and the figures of peers that have
// only calibrated, must not move a route back and forth). Never mid-session: a session on the
// route keeps it. Only live figures trigger it: a peer that joins, or a round trip that
// settles, changes no route that serves (a joining peer becomes a spare, as before). Closing the
// route and loading the new one takes as long as any plan: requests meanwhile wait for it
// (streamed ones) or are told the route is not ready.

import type { GgufHeader, ShardRange } from '../src/gguf/types.ts';
import type { PlannedStage, PlannerPeer } from '../src/route/planner.ts';
import { speedGain } from './plan-choice.ts';
import type { SpeedFacts } from './plan-choice.ts';

/** The default least gain (route's predicted step over the re-plan's) that re-plans an idle route. */
export const REPLAN_GAIN = 1.3;
/** How often a ready route is looked at (ms). */
const CHECK_MS = 1_000;
/** How far (relative) a peer's live figure must move since the last weighing for the route to be weighed again. */
const MOVED = 0.1;

/** What the re-planner needs of its room (room.ts). */
export interface ReplanRoom {
  readonly route: { readonly id: number; readonly status: string; readonly stages: ReadonlyArray<{ peerId: string; shard: ShardRange }> } | null;
  readonly model: { readonly header: GgufHeader; readonly nLayer: number };
  readonly sessions: { liveCount(kept?: boolean, routeId?: number): number };
  /** the peers the next plan would consider, with their figures of now */
  plannerPeers(): Array<PlannerPeer & SpeedFacts>;
  log(line: string): void;
  /** closes the route and plans anew */
  replan(why: string): void;
}

const sameChain = (a: readonly PlannedStage[], b: ReadonlyArray<{ peerId: string; shard: ShardRange }>): boolean =>
  a.length === b.length && a.every((s, i) => s.peerId === b[i]!.peerId && s.shard.start === b[i]!.shard.start && s.shard.end === b[i]!.shard.end);

export class SpeedReplanner {
  private readonly timer: NodeJS.Timeout;
  /** the route last weighed, and its peers' live figures then */
  private weighed: { routeId: number; live: Map<string, number> } = { routeId: -1, live: new Map() };

  constructor(
    private readonly room: ReplanRoom,
    private readonly gain = REPLAN_GAIN,
  ) {
    // (a timer's throw would end the server: a check that fails is logged, the route kept)
    this.timer = setInterval(() => {
      try {
        this.check();
      } catch (e) {
        this.room.log(`weighing the route against a re-plan failed: ${(e as Error).message}`);
      }
    }, CHECK_MS);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Weighs the route if it is idle and a live figure moved; re-plans it if another chain is `gain` times faster. */
  check(): void {
    const r = this.room.route;
    if (!r || r.status !== 'ready') return;
    const { sessions } = this.room;
    if (sessions.liveCount(false, r.id) > sessions.liveCount(true, r.id)) return;
    const peers = this.room.plannerPeers();
    const live = new Map(peers.filter((p) => p.speed?.source === 'live').map((p) => [p.id, p.speed!.decodeMsPerLayer]));
    const before = this.weighed.routeId === r.id ? this.weighed.live : new Map<string, number>();
    const moved = [...live].some(([id, ms]) => !before.has(id) || Math.abs(ms - before.get(id)!) >= MOVED * before.get(id)!);
    if (!moved) return;
    this.weighed = { routeId: r.id, live };
    const gain = speedGain(this.room.model.header, this.room.model.nLayer, peers, r.stages);
    if (!gain || sameChain(gain.stages, r.stages) || gain.currentMs < this.gain * gain.predictedMs) return;
    const chain = gain.stages.map((s) => `${s.peerId} [${s.shard.start}, ${s.shard.end})`).join(' → ');
    this.room.replan(`idle, and its predicted ${gain.currentMs.toFixed(2)} ms per token under the live figures is ${(gain.currentMs / gain.predictedMs).toFixed(2)}× the ${gain.predictedMs.toFixed(2)} ms of ${chain}`);
  }
}
