// Re-planning a speed-planned room's route once its peers' live figures (live-speed.ts) or its
// measured links (link-matrix.ts, timed again every while: link-probes.ts) say it is slow:
// every CHECK_MS, a ready route with no session on it (kept sessions of the prefix cache aside:
// they are a cache, not a client's) is weighed again when a peer's live decode figure has moved
// by MOVED or more since the last weighing, or a measured link's round trip by MOVED and at
// least LINK_MOVED_MS (a loopback pair's 0.4 → 0.5 ms is no news) — the planner's chain for the
// figures of now (plan-choice.ts speedGain) against the route's own predicted step under the
// same figures — and re-planned when the chain is another and at least `gain` times faster
// (`serve --replan-gain`, default 1.3: noise in the figures, and the figures of peers that have
// only calibrated, must not move a route back and forth). Never mid-session: a session on the
// route keeps it. Only figures that moved trigger it: a peer that joins (its links new, not
// moved), or a heartbeat's round trip that settles, changes no route that serves (a joining
// peer becomes a spare, as before). Closing the
// route and loading the new one takes as long as any plan: requests meanwhile wait for it
// (streamed ones) or are told the route is not ready.

import type { GgufHeader, ShardRange } from '../src/gguf/types.ts';
import type { PlannedStage, PlannerPeer } from '../src/route/planner.ts';
import { speedGain } from './plan-choice.ts';
import type { MeasuredLinks } from './plan-choice.ts';
import type { SpeedFacts } from './plan-choice.ts';

/** The default least gain (route's predicted step over the re-plan's) that re-plans an idle route. */
export const REPLAN_GAIN = 1.3;
/** How often a ready route is looked at (ms). */
const CHECK_MS = 1_000;
/** How far (relative) a peer's live figure or a measured link must move since the last weighing for the route to be weighed again. */
const MOVED = 0.1;
/** ... and a link at least this far (ms of round trip) */
const LINK_MOVED_MS = 1;

/** What the re-planner needs of its room (room.ts). */
export interface ReplanRoom {
  readonly route: { readonly id: number; readonly status: string; readonly stages: ReadonlyArray<{ peerId: string; shard: ShardRange }> } | null;
  readonly model: { readonly header: GgufHeader; readonly nLayer: number };
  readonly sessions: { liveCount(kept?: boolean, routeId?: number): number };
  /** the peers the next plan would consider, with their figures of now */
  plannerPeers(): Array<PlannerPeer & SpeedFacts>;
  /** the measured links between peers, each pair's round trip among its records */
  readonly links?: MeasuredLinks & { records(): ReadonlyArray<{ a: string; b: string; rttMs: number }> };
  log(line: string): void;
  /** closes the route and plans anew */
  replan(why: string): void;
}

const sameChain = (a: readonly PlannedStage[], b: ReadonlyArray<{ peerId: string; shard: ShardRange }>): boolean =>
  a.length === b.length && a.every((s, i) => s.peerId === b[i]!.peerId && s.shard.start === b[i]!.shard.start && s.shard.end === b[i]!.shard.end);

export class SpeedReplanner {
  private readonly timer: NodeJS.Timeout;
  /** the route last weighed (or first looked at), and its peers' live figures and the measured links then */
  private weighed: { routeId: number; live: Map<string, number>; links: Map<string, number> } = { routeId: -1, live: new Map(), links: new Map() };

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

  /** Weighs the route if it is idle and a live figure or a measured link moved; re-plans it if another chain is `gain` times faster. */
  check(): void {
    const r = this.room.route;
    if (!r || r.status !== 'ready') return;
    const { sessions } = this.room;
    if (sessions.liveCount(false, r.id) > sessions.liveCount(true, r.id)) return;
    const peers = this.room.plannerPeers();
    const live = new Map(peers.filter((p) => p.speed?.source === 'live').map((p) => [p.id, p.speed!.decodeMsPerLayer]));
    const links = new Map((this.room.links?.records() ?? []).map((l) => [`${l.a} ↔ ${l.b}`, l.rttMs]));
    // a route first looked at: its links as they are now are what a later move is measured from
    if (this.weighed.routeId !== r.id) this.weighed = { routeId: r.id, live: new Map(), links };
    const before = this.weighed;
    const moved = (was: number | undefined, now: number, least = 0): boolean => was === undefined || Math.abs(now - was) >= Math.max(MOVED * was, least);
    const liveMoved = [...live].some(([id, ms]) => moved(before.live.get(id), ms));
    const linkMoved = [...links].filter(([k]) => before.links.has(k)).find(([k, ms]) => moved(before.links.get(k), ms, LINK_MOVED_MS));
    if (!liveMoved && !linkMoved) {
      for (const [k, ms] of links) if (!before.links.has(k)) before.links.set(k, ms); // a pair measured since: from its first figure on
      return;
    }
    this.weighed = { routeId: r.id, live, links };
    if (linkMoved) this.room.log(`link ${linkMoved[0]} now ${linkMoved[1].toFixed(2)} ms round trip (was ${before.links.get(linkMoved[0])!.toFixed(2)}): weighing the idle route again`);
    const gain = speedGain(this.room.model.header, this.room.model.nLayer, peers, r.stages, this.room.links);
    if (!gain || sameChain(gain.stages, r.stages) || gain.currentMs < this.gain * gain.predictedMs) return;
    const chain = gain.stages.map((s) => `${s.peerId} [${s.shard.start}, ${s.shard.end})`).join(' → ');
    this.room.replan(`idle, and its predicted ${gain.currentMs.toFixed(2)} ms per token under the live figures is ${(gain.currentMs / gain.predictedMs).toFixed(2)}× the ${gain.predictedMs.toFixed(2)} ms of ${chain}`);
  }
}
