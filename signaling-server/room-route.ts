// A room's route: its stages (which peer serves which layers), its status — forming → loading
// → ready ⇄ repairing, → degraded → closed — and what the session manager asks of it (the entry
// link, each stage's link and peer, the repair under way, a stall probe) or tells it (its decode
// steps' stage timings). The room plans and changes it (room.ts); the keeper repairs it
// (route-repair.ts). A route sees its room only through RouteOwner, so this module imports no
// room file.

import { MeshError } from '../src/errors.ts';
import type { GgufHeader, ShardRange } from '../src/gguf/types.ts';
import { HYBRID_ARCHITECTURES } from '../src/model/qwen35-config.ts';
import type { CandidatePair } from '../src/protocol/control.ts';
import type { StepTiming } from '../src/protocol/payload.ts';
import type { RouteHandle } from '../src/route/sessions.ts';
import { starLinkMs } from '../src/route/speed-planner.ts';
import type { HopLink, TelemetryEvent } from '../src/route/telemetry.ts';
import type { FrameLink } from '../src/transport/link.ts';
import { noteDecodeCost } from './live-speed.ts';
import { headLayers } from './plan-choice.ts';
import type { MeasuredLinks } from './plan-choice.ts';
import type { RepairState, Spare } from './repair-state.ts';
import type { Peer } from './room-peer.ts';

export type RouteStatus = 'forming' | 'loading' | 'ready' | 'repairing' | 'degraded' | 'closed';

export interface RouteStage {
  stage: number;
  peerId: string;
  shard: ShardRange;
  status: 'loading' | 'ready' | 'failed' | 'lost';
  listen: string | null;
  loadMs?: number;
  bytesRead?: number;
  error?: { code: string; message: string };
  /** bytes of the shard loaded so far (native peers report while loading) */
  loading?: { bytesDone: number; bytesTotal: number };
  /** the last stage linked to stage 0 for the ring (its `ready`) */
  ring?: boolean;
  /** the stage's own report (browser peers): load progress, hop to the next stage, frame counters */
  telemetry?: Record<string, unknown>;
}

/** What a route asks of the room that owns it (room.ts implements it). */
export interface RouteOwner {
  readonly id: string;
  readonly model: { readonly id: string; readonly contextLength?: number; readonly header: GgufHeader; readonly nLayer: number };
  readonly peers: ReadonlyMap<string, Peer>;
  /** the round trips measured between peers (link-matrix.ts) */
  readonly links?: MeasuredLinks;
  readonly keeper: { summary(): Spare[] };
  log(line: string): void;
  emit(e: TelemetryEvent): void;
  /** asks every stage for its status; one that does not answer in time is lost (stalled) */
  probeStages(r: Route): Promise<void>;
  peerSummary(id: string): Record<string, unknown> | null;
}

export class Route implements RouteHandle {
  status: RouteStatus = 'forming';
  reason: string | null = null;
  readonly history: RouteStatus[] = ['forming'];
  entryLink: FrameLink | null = null;
  readonly createdAt = Date.now();
  /** the repair under way (route-repair.ts), if a stage lost its peer */
  repairState: RepairState | null = null;
  private recurrentModel: boolean | undefined;
  /** the stall probe in flight, shared by every session whose step is overdue */
  private probing: Promise<void> | null = null;
  /** the head's decode cost in layers (plan-choice.ts), once a step is observed */
  private head: number | undefined;

  get contextLimit(): number | undefined {
    return this.room.model.contextLength;
  }

  constructor(
    readonly id: number,
    readonly room: RouteOwner,
    readonly stages: RouteStage[],
  ) {}

  setStatus(s: RouteStatus, reason: string | null = null): void {
    if (this.status === s || this.status === 'closed') return;
    this.status = s;
    this.reason = reason;
    this.history.push(s);
    this.room.log(`route ${this.id}: ${s}${reason ? ` (${reason})` : ''}`);
    this.room.emit({ type: 'route_status', routeId: this.id, status: s, reason });
  }

  entry(): FrameLink {
    if (this.status !== 'ready' || !this.entryLink) throw new MeshError('ROUTE_NOT_READY', `route ${this.id} is ${this.status}${this.reason ? `: ${this.reason}` : ''}`);
    return this.entryLink;
  }

  stageLinks(): Array<FrameLink | null> {
    return this.stages.map((s) => {
      const p = this.room.peers.get(s.peerId);
      return p && !p.gone ? p.control : null;
    });
  }

  stagePeers(): string[] {
    return this.stages.map((s) => s.peerId);
  }

  /** every stage's peer takes ReturnDirect and sends the last stage's token as a `return` message */
  directReturn(): boolean {
    return this.stages.every((s) => this.room.peers.get(s.peerId)?.hello.directReturn === true);
  }

  /**
   * The one-way token path's hops as the planner prices them (ms one way): half the server round
   * trip of the first and last stages' peers, and between stages the measured link, else the
   * star through the server. NaN where a peer has no round trip yet (the wire time is then shared evenly).
   */
  hopLatencyMs(): number[] {
    const at = (id: string) => ({ id, rttMs: this.room.peers.get(id)?.rttMs ?? NaN });
    const peers = this.stagePeers().map(at);
    const between = peers.slice(1).map((b, i) => this.room.links?.oneWayMs(peers[i]!.id, b.id) ?? starLinkMs(peers[i]!, b));
    return [peers[0]!.rttMs / 2, ...between, peers.at(-1)!.rttMs / 2];
  }

  /**
   * the ring (FrameFlag.Ring): every stage's peer takes it and the last stage linked to stage 0 —
   * never after a repair or hand-over (the last stage's link may lead to a stage 0 that left, and
   * the sessions the repair rebuilt go one-way from then on)
   */
  ring(): boolean {
    return this.stages.length > 1 && this.stages.at(-1)!.ring === true && !this.history.includes('repairing') && this.stages.every((s) => this.room.peers.get(s.peerId)?.hello.ring === true);
  }

  /** every stage's peer takes FrameFlag.Verify (speculative decoding) */
  verify(): boolean {
    return !this.recurrent && this.stages.every((s) => this.room.peers.get(s.peerId)?.hello.verify === true);
  }

  /**
   * the model has recurrent layers (Gated DeltaNet): their state after a frame cannot drop the
   * rejected drafts at its end, so no route of it speculates
   */
  private get recurrent(): boolean {
    return (this.recurrentModel ??= (HYBRID_ARCHITECTURES as readonly unknown[]).includes(this.room.model.header.metadata['general.architecture']));
  }

  stageBackends(): string[] {
    return this.stages.map((s) => this.room.peers.get(s.peerId)?.hello.backend ?? '?');
  }

  /** What sessions wait on while a lost stage is replaced (a graceful leave: only once the swap begins). */
  repair(): RepairState | null {
    return this.status === 'repairing' ? this.repairState : null;
  }

  /** A step went unanswered: a stage that does not answer a status probe in time is treated as lost (one probe at a time, however many sessions wait). */
  suspectStall(): Promise<void> {
    this.probing ??= this.room.probeStages(this).finally(() => (this.probing = null));
    return this.probing;
  }

  /**
   * A decode step that ran alone (route/step-observer.ts): each stage's own compute over its
   * layers — the last stage's head counted in layers, as the planner models it — refreshes its
   * peer's live decode figure (live-speed.ts)
   */
  observeStep(records: readonly StepTiming[]): void {
    if (this.status !== 'ready') return;
    const head = (this.head ??= headLayers(this.room.model.header, this.room.model.nLayer));
    for (const r of records) {
      const st = this.stages[r.stage];
      const p = st && this.room.peers.get(st.peerId);
      const layers = st ? st.shard.end - st.shard.start + (r.stage === this.stages.length - 1 ? head : 0) : 0;
      if (p && !p.gone && layers > 0) noteDecodeCost(p, r.computeUs / 1000 / layers);
    }
  }

  /** How each hop is carried, from the stages' own reports (a native node without WebRTC reports none: ws to a listen address, else the relay). */
  hops(): HopLink[] {
    return this.stages.slice(0, -1).map((st) => {
      const next = this.stages[st.stage + 1]!;
      const t = st.telemetry as { hop?: string; candidatePair?: CandidatePair | null } | undefined;
      return { from: st.stage, to: next.stage, fromPeer: st.peerId, toPeer: next.peerId, kind: t?.hop ?? (next.listen ? 'ws' : 'relay'), candidatePair: t?.candidatePair ?? null };
    });
  }

  summary(): Record<string, unknown> {
    return {
      id: this.id,
      roomId: this.room.id,
      model: this.room.model.id,
      status: this.status,
      reason: this.reason,
      history: this.history,
      stages: this.stages.map((s) => ({ ...s, peer: this.room.peerSummary(s.peerId) })),
      repair: this.repairState ? { since: this.repairState.since, stages: this.repairState.stages, lost: [...this.repairState.lost.values()] } : null,
      spares: this.room.keeper.summary(),
      hops: this.hops(),
    };
  }
}
