// Which planner plans a room's route: `serve --planner memory` (the default), explicit
// `--layers` and held ranges go to the memory planner (route/planner.ts), as before; with
// `--planner speed`, where every peer that serves layer ranges
// has a measured speed (its hello's calibration), the planner that knows speed and links
// (route/speed-planner.ts) picks the chain — peers, order, ranges — of least predicted decode
// time, with each peer's control-socket round trip as its link. Budgets (issue 25) plug in as
// each peer's memoryBytes.

import { shardBytes } from '../src/backends/shard.ts';
import type { GgufHeader, ShardRange } from '../src/gguf/types.ts';
import { planRoute } from '../src/route/planner.ts';
import type { Plan, PlannerPeer } from '../src/route/planner.ts';
import { planBySpeed, predictStepMs } from '../src/route/speed-planner.ts';
import type { PeerSpeedRecord, SpeedPlanInput } from '../src/route/speed-planner.ts';
import type { PeerSpeed } from '../src/protocol/control.ts';

export type PlannerKind = 'speed' | 'memory';

/** What the choice needs of a peer besides the memory planner's record. */
export interface SpeedFacts {
  speed?: PeerSpeed | undefined;
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

/** `trusted` (a public room): the first and last stages go to trusted peers, which only the memory planner pins, so it plans. */
export function choosePlan(kind: PlannerKind, header: GgufHeader, nLayer: number, peers: ReadonlyArray<PlannerPeer & SpeedFacts>, trusted?: (id: string) => boolean): PlanChoice {
  const bytes = (range: ShardRange): number => shardBytes(header, range, nLayer);
  const memory = planRoute({ nLayer, peers, shardBytes: bytes, ...(trusted ? { trusted } : {}) });
  const ranged = peers.filter((p) => p.serves !== 'whole-model');
  const explicit = peers.some((p) => p.layers || p.held);
  if (kind === 'memory' || trusted || explicit || ranged.length === 0 || !ranged.every((p) => p.speed)) return { plan: memory, by: 'memory' };
  const records: PeerSpeedRecord[] = ranged.map((p) => ({ id: p.id, memoryBytes: p.memoryBytes, decodeMsPerLayer: p.speed!.decodeMsPerLayer, rttMs: p.rttMs ?? 0 }));
  const input: SpeedPlanInput = { nLayer, peers: records, shardBytes: bytes, headLayers: headLayers(header, nLayer) };
  const fast = planBySpeed(input);
  const memorySplitMs = memory.ok && memory.stages.every((s) => records.some((r) => r.id === s.peerId)) ? predictStepMs(input, memory.stages) : undefined;
  if (!fast) return { plan: memory, by: 'memory' };
  return { plan: { ok: true, stages: fast.stages }, by: 'speed', predictedMs: fast.predictedMs, ...(memorySplitMs !== undefined ? { memorySplitMs } : {}) };
}
