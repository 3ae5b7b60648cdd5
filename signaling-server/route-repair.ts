// Keeping a room's route whole: warm spares, and replacing a stage whose peer was lost.
//
// Peers that are not in the route are spares: each gets a standby shard (the range it would
// take over), which it loads and verifies ahead of time. When a stage's peer is lost (its
// socket closed, its heartbeat stopped, a step found it stalled) or leaves gracefully, the
// route goes `repairing`: the stage is assigned to a replacement — a warm spare holding that
// shard, else any idle peer that can hold it (cold: it loads now), else the first suitable peer
// to join — its neighbours are rewired to it, and the route is `ready` again. Sessions wait
// meanwhile and are rebuilt on the new peer by the session manager (src/route/repair.ts). With
// no replacement ready within the repair timeout, the sessions fail naming the stage, the peer
// and the cause. Peers that fail repeatedly are kept out of routes and spares with back-off.

import { MeshError } from '../src/errors.ts';
import type { ShardRange } from '../src/gguf/types.ts';
import { shardBytes } from '../src/backends/shard.ts';
import { plannedMemory } from './peer-memory.ts';
import { shardSources } from './shard-sources.ts';
import { RepairState } from './repair-state.ts';
import type { Spare } from './repair-state.ts';
import type { RoomHost } from './room-host.ts';
import type { Peer } from './room-peer.ts';
import type { Route } from './room-route.ts';

export interface RepairOptions {
  /** how long a route may wait for a replacement before its sessions fail (ms; 0 = never repair) */
  repairTimeoutMs: number;
  /** how long a neighbour may take to rewire (ms) */
  rewireTimeoutMs?: number;
  /** spares load their standby shard ahead of time (false: a replacement loads when it takes over) */
  standby?: boolean;
}

/** Who a peer is across reconnects: its name, else its listen address, else its id. */
function identityOf(p: Peer): string {
  return p.hello.name ?? p.hello.listen ?? p.id;
}

const sameRange = (a: ShardRange, b: ShardRange): boolean => a.start === b.start && a.end === b.end;

const BACKOFF_BASE_MS = 5_000;
const BACKOFF_MAX_MS = 5 * 60_000;

export class RouteKeeper {
  readonly spares = new Map<string, Spare>();
  private readonly failures = new Map<string, { count: number; until: number }>();
  /** rewires sent, waiting for `rewired` */
  private readonly rewiring = new Map<string, () => void>();

  constructor(
    private readonly room: RoomHost,
    private readonly opts: RepairOptions,
  ) {}

  get enabled(): boolean {
    return this.opts.repairTimeoutMs > 0;
  }

  /**
   * A peer failed (lost while serving, refused its shard). Once is forgiven (a reloaded tab, a
   * restarted node); from the second time it stays out of routes and spares for a while that
   * doubles with each failure, and the room looks again when the while is over.
   */
  penalise(p: Peer, why: string): void {
    const key = identityOf(p);
    const f = this.failures.get(key) ?? { count: 0, until: 0 };
    f.count++;
    this.failures.set(key, f);
    if (f.count < 2) return;
    const ms = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** (f.count - 2));
    f.until = Date.now() + ms;
    this.room.log(`peer ${p.id} (${key}) kept out of routes for ${ms / 1000} s: ${why} (failure ${f.count})`);
    setTimeout(() => {
      const r = this.room.route;
      if (r?.repairState) this.fillWaiting(r);
      else if (r?.status === 'ready') this.assignStandbys(r);
      this.room.schedulePlan();
    }, ms + 10).unref();
  }

  /** Whether a peer may take a stage or a standby now. */
  eligible(p: Peer): boolean {
    if (p.gone || p.excluded || p.leaving || p.hello.backend === 'none') return false;
    const f = this.failures.get(identityOf(p));
    return !f || f.until <= Date.now();
  }

  /** Can `p` hold and serve `shard`? (memory; llama.cpp peers serve whole models only) */
  canServe(p: Peer, shard: ShardRange): boolean {
    const whole = shard.start === 0 && shard.end === this.room.model.nLayer;
    if (p.hello.backend === 'llamacpp' && !whole) return false;
    return shardBytes(this.room.model.header, shard, this.room.model.nLayer) <= plannedMemory(p);
  }

  /** Can `p` take stage `stage` of `r` (as its replacement, or warm it as a standby)? A fixed `--layers` range must be the stage's; then memory and the room's stage rules. */
  canTake(p: Peer, r: Route, stage: number, as: 'stage' | 'standby' = 'stage'): boolean {
    const st = r.stages[stage];
    if (!st || (p.hello.layers && !sameRange(p.hello.layers, st.shard))) return false;
    return this.canServe(p, st.shard) && this.room.mayServeStage(p, r, stage, as);
  }

  /** `p`'s standby when it is for stage `stage` of `r` as the route stands now (not an older route's stage, not failed). */
  private standbyFor(p: Peer, r: Route, stage: number): Spare | null {
    const s = this.spares.get(p.id);
    const st = r.stages[stage];
    return s && st && s.status !== 'failed' && s.routeId === r.id && s.stage === stage && sameRange(s.shard, st.shard) ? s : null;
  }

  /** Standbys of `r` for stage `stage` (loading or ready). */
  private sparesFor(r: Route, stage: number): number {
    return [...this.spares.values()].filter((s) => s.stage === stage && s.status !== 'failed' && r.stages[stage] && sameRange(s.shard, r.stages[stage]!.shard)).length;
  }

  /** Peers of the room serving no stage of `r` and taking over none. */
  private idlePeers(r: Route): Peer[] {
    const busy = new Set(r.stages.map((s) => s.peerId));
    for (const l of r.repairState?.lost.values() ?? []) if (l.replacement) busy.add(l.replacement);
    return [...this.room.peers.values()].filter((p) => !busy.has(p.id) && this.eligible(p));
  }

  /**
   * Gives every idle peer a standby shard for a stage of `r` it can take: the one it holds, else
   * the stage with the fewest spares. Called after every change of the route (a new plan, a
   * repair) and of the peers: a standby for a stage the route no longer has (or no longer has
   * with that range), or one the peer may not take, is re-targeted; peers that now serve a
   * stage, or may not be spares, are spares no more.
   */
  assignStandbys(r: Route): void {
    if (!this.enabled || r.status !== 'ready' || this.opts.standby === false) return;
    const idle = this.idlePeers(r);
    const idleIds = new Set(idle.map((p) => p.id));
    for (const id of [...this.spares.keys()]) if (!idleIds.has(id)) this.spares.delete(id);
    for (const p of idle) {
      const current = this.spares.get(p.id);
      if (current && this.standbyFor(p, r, current.stage) && this.canTake(p, r, current.stage, 'standby')) continue;
      this.spares.delete(p.id);
      const fits = r.stages.filter((st) => this.canTake(p, r, st.stage, 'standby'));
      if (fits.length === 0) {
        if (current) this.room.log(`peer ${p.id}: no longer a spare (its standby ${current.shard.start}-${current.shard.end} is no stage of route ${r.id} it can take)`);
        continue;
      }
      const wanted = p.hello.layers ?? this.room.heldRangeOf(p);
      const pick = fits.find((st) => wanted && sameRange(st.shard, wanted)) ?? [...fits].sort((a, b) => this.sparesFor(r, a.stage) - this.sparesFor(r, b.stage) || b.stage - a.stage)[0]!;
      this.spares.set(p.id, { peerId: p.id, routeId: r.id, stage: pick.stage, shard: { ...pick.shard }, status: 'loading' });
      this.room.log(`peer ${p.id}: spare for stage ${pick.stage} of route ${r.id} (layers ${pick.shard.start}-${pick.shard.end}), loading its standby shard`);
      this.room.send(p, { t: 'standby', routeId: r.id, stage: pick.stage, shard: { ...pick.shard }, nLayer: this.room.model.nLayer, modelUrl: this.room.modelUrlFor(p), sources: shardSources(this.room, p, pick.shard) });
    }
  }

  /** A spare's standby load ended; a report for an earlier standby (of another route or stage: since re-targeted) is stale. */
  onStandby(p: Peer, ok: boolean, detail: string, of: { routeId: number; stage: number }): void {
    const s = this.spares.get(p.id);
    if (!s || s.routeId !== of.routeId || s.stage !== of.stage) return;
    s.status = ok ? 'ready' : 'failed';
    this.room.log(`peer ${p.id}: standby shard ${s.shard.start}-${s.shard.end} ${ok ? 'ready' : `failed: ${detail}`}`);
    if (!ok) this.penalise(p, `standby load failed: ${detail}`);
    const r = this.room.route;
    if (ok && r?.repairState) this.fillWaiting(r);
  }

  /**
   * Stage `stage` of `r` lost its peer (or it is leaving: `graceful`). Returns false when the
   * route cannot be repaired (repair off, or the route was not serving).
   */
  stageLost(r: Route, stage: number, lostPeer: string, cause: string, graceful = false): boolean {
    if (!this.enabled || (r.status !== 'ready' && r.status !== 'repairing')) return false;
    let rep = r.repairState;
    const firstLoss = !rep;
    if (!rep) {
      rep = r.repairState = new RepairState();
      rep.timer = setTimeout(() => this.giveUp(r), this.opts.repairTimeoutMs);
      rep.timer.unref();
    }
    const existing = rep.lost.get(stage);
    let converted = false;
    let swapped = false;
    if (existing && existing.replacement === lostPeer) {
      // the replacement itself was lost before it was ready: find another
      existing.replacement = null;
      existing.phase = 'waiting';
    } else if (!existing) {
      rep.lost.set(stage, { stage, lostPeer, cause, replacement: null, warm: false, graceful, phase: 'waiting' });
    } else if (existing.graceful && !graceful && existing.lostPeer === lostPeer) {
      // a leaving peer gone mid-hand-over (a closed tab that said leave first): a plain repair from here
      existing.graceful = false;
      existing.cause = cause;
      existing.gone?.();
      converted = true;
      swapped = existing.phase === 'rewiring' || existing.phase === 'done';
    }
    if (!graceful && !swapped) {
      const st = r.stages[stage]!;
      const taking = converted && existing!.phase === 'loading' && existing!.replacement ? this.room.peers.get(existing!.replacement) : undefined;
      if (taking) Object.assign(st, { peerId: taking.id, status: 'loading', listen: taking.hello.listen ?? null });
      else st.status = 'lost';
      if (firstLoss || r.status === 'ready') r.setStatus('repairing', `stage ${stage} (${lostPeer}) ${graceful ? 'is leaving' : 'lost'}: ${cause}`);
    }
    this.room.emit({ type: 'stage_lost', routeId: r.id, stage, peerId: lostPeer, cause });
    // a rewire this peer was asked for will never come: its replacement links by its own assignment
    for (const [key, done] of [...this.rewiring]) if (key.startsWith(`${lostPeer}/`)) done();
    // every stage lost: nothing survives to rebuild from — plan a fresh route instead
    if (r.stages.every((st) => st.status === 'lost' && !rep!.lost.get(st.stage)?.replacement)) {
      this.giveUp(r, 'every stage was lost');
      return true;
    }
    this.fillWaiting(r);
    return true;
  }

  /** Assigns a replacement to every lost stage still waiting for one. */
  fillWaiting(r: Route): void {
    const rep = r.repairState;
    if (!rep) return;
    for (const l of rep.lost.values()) {
      if (l.replacement) continue;
      const shard = r.stages[l.stage]!.shard;
      const able = this.idlePeers(r).filter((p) => this.canTake(p, r, l.stage));
      const standby = (p: Peer): Spare | null => this.standbyFor(p, r, l.stage);
      // a peer that rejoined (its control socket dropped) still holding this shard verified loads nothing
      const holds = (p: Peer): boolean => {
        const h = this.room.heldRangeOf(p);
        return !!h && h.start <= shard.start && h.end >= shard.end;
      };
      // a spare of another stage goes last, taken from the stage with the most spares
      const othersFirst = able.filter((p) => this.spares.has(p.id)).sort((a, b) => this.sparesFor(r, this.spares.get(b.id)!.stage) - this.sparesFor(r, this.spares.get(a.id)!.stage));
      const pick = able.find((p) => standby(p)?.status === 'ready') ?? able.find(holds) ?? able.find((p) => standby(p) !== null) ?? able.find((p) => !this.spares.has(p.id)) ?? othersFirst[0];
      if (!pick) continue;
      l.replacement = pick.id;
      l.warm = standby(pick)?.status === 'ready';
      l.phase = 'loading';
      this.spares.delete(pick.id);
      this.room.log(`route ${r.id}: stage ${l.stage} goes to ${pick.id} (${l.warm ? 'warm spare' : 'cold: it loads now'})`);
      this.room.emit({ type: 'route_repairing', routeId: r.id, stages: rep.stages, replacementPeer: pick.id, warm: l.warm });
      if (!l.graceful) {
        const st = r.stages[l.stage]!;
        st.peerId = pick.id;
        st.status = 'loading';
        st.listen = pick.hello.listen ?? null;
      }
      this.room.assignStage(r, l.stage, pick);
    }
  }

  /** The peer taking over `stage` of `r`, if `p` is one. */
  replacementStage(r: Route, p: Peer): number | null {
    for (const l of r.repairState?.lost.values() ?? []) if (l.replacement === p.id && l.phase === 'loading') return l.stage;
    return null;
  }

  /** A replacement failed to load: penalise it and find another. */
  replacementFailed(r: Route, p: Peer, why: string): void {
    const stage = this.replacementStage(r, p);
    if (stage === null) return;
    const l = r.repairState!.lost.get(stage)!;
    l.replacement = null;
    l.phase = 'waiting';
    this.penalise(p, why);
    this.fillWaiting(r);
  }

  /** A replacement is ready: swap it in (a graceful leave: after the sessions' steps in flight), rewire its neighbours, maybe finish. */
  async replacementReady(r: Route, p: Peer): Promise<void> {
    const stage = this.replacementStage(r, p);
    const rep = r.repairState;
    if (stage === null || !rep) return;
    const l = rep.lost.get(stage)!;
    l.phase = 'rewiring';
    if (l.graceful) {
      // new steps wait from here; the ones in flight finish on the leaving peer
      if (r.status === 'ready') r.setStatus('repairing', `stage ${stage} (${l.lostPeer}) is leaving; ${p.id} takes over`);
      await Promise.race([this.room.sessions.settled(r.id), new Promise<void>((resolve) => (l.gone = resolve))]);
      const st = r.stages[stage]!;
      st.peerId = p.id;
      st.listen = p.hello.listen ?? null;
    }
    r.stages[stage]!.status = 'ready';
    try {
      await this.rewireAround(r, stage, p);
    } catch (e) {
      this.room.log(`route ${r.id}: rewiring around stage ${stage} failed: ${(e as Error).message}`);
      return this.giveUp(r, (e as Error).message);
    }
    l.phase = 'done';
    if ([...rep.lost.values()].every((x) => x.phase === 'done')) this.finish(r);
  }

  /** Tells the stages before and after `stage` about its new peer, and waits until both opened their links. */
  private async rewireAround(r: Route, stage: number, p: Peer): Promise<void> {
    const waits: Array<Promise<void>> = [];
    const prev = r.stages[stage - 1];
    const next = r.stages[stage + 1];
    const tell = (st: NonNullable<typeof prev>, fields: Record<string, unknown>): void => {
      const peer = this.room.peers.get(st.peerId);
      if (!peer) return;
      // a neighbour still loading (itself a replacement) applies the rewire when its load is done
      if (st.status === 'ready') waits.push(this.awaitRewired(peer.id, r.id, st.stage));
      this.room.send(peer, { t: 'rewire', routeId: r.id, stage: st.stage, ...fields });
    };
    if (prev) tell(prev, this.room.downstreamOf(p.id, p.hello));
    if (next) tell(next, { upstreamPeer: p.id });
    await Promise.all(waits);
    if (stage === 0) await this.room.connectEntry(r);
  }

  private awaitRewired(peerId: string, routeId: number, stage: number): Promise<void> {
    const key = `${peerId}/${routeId}/${stage}`;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.rewiring.delete(key);
        reject(new MeshError('STAGE_UNREACHABLE', `peer ${peerId} did not rewire stage ${stage} within ${this.rewireTimeoutMs} ms`, { stage }));
      }, this.rewireTimeoutMs);
      this.rewiring.set(key, () => {
        clearTimeout(timer);
        this.rewiring.delete(key);
        resolve();
      });
    });
  }

  onRewired(p: Peer, routeId: number, stage: number): void {
    this.rewiring.get(`${p.id}/${routeId}/${stage}`)?.();
  }

  private get rewireTimeoutMs(): number {
    return this.opts.rewireTimeoutMs ?? 10_000;
  }

  private finish(r: Route): void {
    const rep = r.repairState!;
    if (rep.timer) clearTimeout(rep.timer);
    r.repairState = null;
    const leavers = [...rep.lost.values()].filter((l) => l.graceful);
    r.setStatus('ready');
    this.room.log(`route ${r.id}: repaired in ${Date.now() - rep.since} ms (stages ${rep.stages.join(', ')})`);
    rep.resolve();
    this.room.sessions.routeRepaired(r.id);
    for (const l of leavers) this.room.leaveDone(l.lostPeer, true);
    this.assignStandbys(r);
  }

  /** No replacement in time (or the repair broke): the sessions fail naming the stage, the peer and the cause; the room replans. */
  giveUp(r: Route, why?: string): void {
    const rep = r.repairState;
    if (!rep) return;
    if (rep.timer) clearTimeout(rep.timer);
    r.repairState = null;
    const lost = [...rep.lost.values()];
    const reason = why ?? `no replacement was ready within ${this.opts.repairTimeoutMs / 1000} s`;
    for (const l of lost) {
      const st = r.stages[l.stage]!;
      st.status = 'lost';
      void this.room.sessions.stageLost(r.id, l.stage, `${l.cause}; ${reason}`, { peerId: l.lostPeer });
      if (l.graceful) this.room.leaveDone(l.lostPeer, false);
    }
    const first = lost[0]!;
    rep.reject(new MeshError('STAGE_LOST', `stage ${first.stage} (${first.lostPeer}) left: ${first.cause}; ${reason}`, { stage: first.stage }));
    r.setStatus('degraded', `stage ${first.stage} (${first.lostPeer}): ${first.cause}; ${reason}`);
    this.room.schedulePlan();
  }

  /** The spares, for /v1/routes and the page. */
  summary(): Spare[] {
    // a new route's spares are the ones re-targeted to it once it is ready
    return [...this.spares.values()].filter((s) => s.routeId === this.room.route?.id).map((s) => ({ ...s, shard: { ...s.shard } }));
  }
}
