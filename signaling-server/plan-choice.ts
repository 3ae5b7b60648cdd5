// Which planner plans a room's route: `serve --planner memory` (the default), explicit
// `--layers` and held ranges go to the memory planner (route/planner.ts), as before; with
// `--planner speed`, where every peer that serves layer ranges has a measured speed (its
// hello's calibration, or its live steps' figure: live-speed.ts), the planner that knows speed
// and links (route/speed-planner.ts) picks the chain — peers, order, ranges — of least
// predicted decode time, with each peer's control-socket round trip as its link to the server,
// and between two peers the room's measured round trip (link-matrix.ts) where there is one, else
// the star through the server (the sum of both peers' one-way latencies to it). Budgets
// (issue 25) plug in as each peer's memoryBytes. `speedGain` weighs a ready route against the
// chain the figures of now would pick (speed-replan.ts).

import { shardBytes } from '../src/backends/shard.ts';
import type { GgufHeader, ShardRange } from '../src/gguf/types.ts';
import { planRoute } from '../src/route/planner.ts';
import type { Plan, PlannedStage, PlannerPeer } from '../src/route/planner.ts';
import { planBySpeed, predictStepMs, starLinkMs } from '../src/route/speed-planner.ts';
import type { PeerSpeedRecord, SpeedPlanInput } from '../src/route/speed-planner.ts';

export type PlannerKind = 'speed' | 'memory';

/** The one-way latency between two peers where it was measured (link-matrix.ts). */
export interface MeasuredLinks {
  oneWayMs(a: string, b: string): number | undefined;
}

/** What the choice needs of a peer besides the memory planner's record. */
export interface SpeedFacts {
  /** its decode figure and where it came from (live-speed.ts plannedSpeed) */
  speed?: { decodeMsPerLayer: number; source?: 'calibration' | 'live' } | undefined;
  rttMs?: number | undefined;
}

export interface PlanChoice {
  plan: Plan;
  /** which planner made it, and the model's predicted decode step (ms) of it and of the memory split, where speeds are known */
  by: PlannerKind;
  predictedMs?: number;
  memorySplitMs?: number;
}

/** The head's decode cost in layers: its bytes over one middle layer's (decode reads every weight once). */
export function headLayers(header: GgufHeader, nLayer: number): number {
  if (nLayer < 3) return 0;
  const layer = shardBytes(header, { start: 1, end: 2 }, nLayer);
  const last = shardBytes(header, { start: nLayer - 1, end: nLayer }, nLayer);
  return layer > 0 ? Math.max(0, last - layer) / layer : 0;
}

/** The speed planner's input, or null where the room plans by memory (a public room's pinned ends, explicit or held ranges, a ranged peer with no speed). */
function speedInput(header: GgufHeader, nLayer: number, peers: ReadonlyArray<PlannerPeer & SpeedFacts>, trusted: unknown, links?: MeasuredLinks): SpeedPlanInput | null {
  const ranged = peers.filter((p) => p.serves !== 'whole-model');
  if (trusted || peers.some((p) => p.layers || p.held) || ranged.length === 0 || !ranged.every((p) => p.speed)) return null;
  const records: PeerSpeedRecord[] = ranged.map((p) => ({ id: p.id, memoryBytes: p.memoryBytes, decodeMsPerLayer: p.speed!.decodeMsPerLayer, rttMs: p.rttMs ?? 0 }));
  return {
    nLayer, peers: records, shardBytes: (range: ShardRange) => shardBytes(header, range, nLayer), headLayers: headLayers(header, nLayer),
    ...(links ? { linkMs: (a: PeerSpeedRecord, b: PeerSpeedRecord) => links.oneWayMs(a.id, b.id) ?? starLinkMs(a, b) } : {}),
  };
}

const covers = (input: SpeedPlanInput, stages: readonly PlannedStage[]): boolean => stages.every((s) => input.peers.some((r) => r.id === s.peerId));

/** `trusted` (a public room): the first and last stages go to trusted peers, which only the memory planner pins, so it plans. */
export function choosePlan(kind: PlannerKind, header: GgufHeader, nLayer: number, peers: ReadonlyArray<PlannerPeer & SpeedFacts>, trusted?: (id: string) => boolean, links?: MeasuredLinks): PlanChoice {
  const memory = planRoute({ nLayer, peers, shardBytes: (range) => shardBytes(header, range, nLayer), ...(trusted ? { trusted } : {}) });
  const input = kind === 'speed' ? speedInput(header, nLayer, peers, trusted, links) : null;
  const fast = input && planBySpeed(input);
  if (!input || !fast) return { plan: memory, by: 'memory' };
  const memorySplitMs = memory.ok && covers(input, memory.stages) ? predictStepMs(input, memory.stages) : undefined;
  return { plan: { ok: true, stages: fast.stages }, by: 'speed', predictedMs: fast.predictedMs, ...(memorySplitMs !== undefined ? { memorySplitMs } : {}) };
}

/**
 * The chain the speed planner picks from `peers` with the figures of now, and the predicted step
 * of `current` (the route as it stands) under the same figures; null where the room would not
 * plan by speed or a stage of `current` is no longer a candidate.
 */
export function speedGain(header: GgufHeader, nLayer: number, peers: ReadonlyArray<PlannerPeer & SpeedFacts>, current: readonly PlannedStage[], links?: MeasuredLinks): { stages: PlannedStage[]; predictedMs: number; currentMs: number } | null {
  const input = speedInput(header, nLayer, peers, undefined, links);
  const fast = input && covers(input, current) ? planBySpeed(input) : null;
  return fast ? { stages: fast.stages, predictedMs: fast.predictedMs, currentMs: predictStepMs(input!, current) } : null;
}
