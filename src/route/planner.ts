// The route planner answers one question: which peer serves which contiguous layer range.
// Peers that asked for explicit layers get them when those ranges tile [0, n_layer); otherwise
// the layers are split over the peers in proportion to their memory, in join order, every
// stage at least one layer, and a peer whose memory cannot hold its shard is left out.
// A peer that serves this model only whole (its engine runs the architecture but not as a
// layer range) is only ever given every layer, as a one-stage route; peers that cannot serve
// the model at all are not given to the planner.

import type { ShardRange } from '../gguf/types.ts';

export interface PlannerPeer {
  id: string;
  /** bytes the peer offers for weights */
  memoryBytes: number;
  /** the range the peer asked for (`--layers`), if any */
  layers?: ShardRange | undefined;
  /** the layer range the peer already holds verified (from its advertised units), if any */
  held?: ShardRange | undefined;
  /** 'ranges' (default): any contiguous layer range; 'whole-model': all layers as one stage, nothing less */
  serves?: 'ranges' | 'whole-model';
}

export interface PlannedStage {
  peerId: string;
  shard: ShardRange;
}

export type Plan = { ok: true; stages: PlannedStage[] } | { ok: false; reason: string };

export interface PlanInput {
  nLayer: number;
  /** in join order */
  peers: readonly PlannerPeer[];
  /** bytes of tensor data shard `range` needs */
  shardBytes: (range: ShardRange) => number;
  /** most stages to use (default: every peer) */
  maxStages?: number;
  /** a public room: the first and last stages go to peers this says are trusted */
  trusted?: (peerId: string) => boolean;
}

/** Explicit ranges that tile [0, n): a chain of peers whose ranges meet end to start. */
function planExplicit(nLayer: number, peers: readonly PlannerPeer[], key: 'layers' | 'held' = 'layers'): PlannedStage[] | string {
  const explicit = peers.filter((p) => p[key]).map((p) => ({ ...p, layers: p[key] }));
  const stages: PlannedStage[] = [];
  let at = 0;
  while (at < nLayer) {
    const next = explicit.find((p) => p.layers!.start === at && p.layers!.end > at && p.layers!.end <= nLayer && !stages.some((s) => s.peerId === p.id));
    if (!next) return `no peer asked for layers starting at ${at} (explicit: ${explicit.map((p) => `${p.id}=${p.layers!.start}-${p.layers!.end}`).join(', ')})`;
    stages.push({ peerId: next.id, shard: { ...next.layers! } });
    at = next.layers!.end;
  }
  return stages;
}

/** Splits [0, n) over `peers` in proportion to memory: boundaries at rounded cumulative shares. */
export function proportionalSplit(nLayer: number, memories: readonly number[]): ShardRange[] {
  const k = memories.length;
  const total = memories.reduce((a, b) => a + b, 0);
  const ends: number[] = [];
  let cum = 0;
  for (let i = 0; i < k; i++) {
    cum += memories[i]!;
    let end = i === k - 1 ? nLayer : Math.round((nLayer * cum) / total);
    const prev = i === 0 ? 0 : ends[i - 1]!;
    end = Math.max(end, prev + 1); // every stage gets a layer
    end = Math.min(end, nLayer - (k - 1 - i)); // and leaves one for each later stage
    ends.push(end);
  }
  return ends.map((end, i) => ({ start: i === 0 ? 0 : ends[i - 1]!, end }));
}

const wholeOnly = (p: PlannerPeer): boolean => p.serves === 'whole-model';

/**
 * A public room's plan: the first and last stages on trusted peers — they alone see token ids
 * and logits — and donors' memory in between, in proportion; a donor that cannot hold its part
 * is left out, never a trusted end. One trusted peer that holds the whole model serves alone.
 */
function planPinned(input: PlanInput, trusted: (peerId: string) => boolean): Plan {
  const { nLayer, peers } = input;
  const ends = peers.filter((p) => trusted(p.id));
  if (ends.length === 0) return { ok: false, reason: 'a public room needs trusted peers for its first and last stages, and none joined' };
  const whole = { start: 0, end: nLayer };
  // a peer that serves this model only whole cannot be one end of a split route
  const rangedEnds = ends.filter((p) => !wholeOnly(p));
  if (rangedEnds.length < 2 || nLayer < 2) {
    const solo = ends.find((p) => input.shardBytes(whole) <= p.memoryBytes);
    if (solo) return { ok: true, stages: [{ peerId: solo.id, shard: whole }] };
    return { ok: false, reason: 'a public room needs two trusted peers for its first and last stages, or one that holds the whole model' };
  }
  const [first, last] = [rangedEnds[0]!, rangedEnds[1]!];
  let middle = [...peers.filter((p) => !trusted(p.id)), ...rangedEnds.slice(2)].filter((p) => !wholeOnly(p)).slice(0, Math.max(0, Math.min(nLayer, input.maxStages ?? Infinity) - 2));
  for (;;) {
    const order = [first, ...middle, last];
    const ranges = proportionalSplit(nLayer, order.map((p) => p.memoryBytes));
    const misfit = ranges.findIndex((r, i) => input.shardBytes(r) > order[i]!.memoryBytes);
    if (misfit < 0) return { ok: true, stages: ranges.map((shard, i) => ({ peerId: order[i]!.id, shard })) };
    if (middle.length === 0) return { ok: false, reason: "the trusted peers' memory cannot hold the model's first and last stages" };
    const smallest = middle.reduce((m, p) => (p.memoryBytes < m.memoryBytes ? p : m));
    middle = middle.filter((p) => p !== smallest);
  }
}

/** A stage a whole-model-only peer cannot take (a partial range), if the plan has one. */
function partialForWholeOnly(nLayer: number, peers: readonly PlannerPeer[], stages: readonly PlannedStage[]): PlannedStage | undefined {
  return stages.find((s) => (s.shard.start !== 0 || s.shard.end !== nLayer) && wholeOnly(peers.find((p) => p.id === s.peerId)!));
}

export function planRoute(input: PlanInput): Plan {
  const { nLayer, peers } = input;
  if (peers.length === 0) return { ok: false, reason: 'no peers in the room' };
  if (input.trusted) return planPinned(input, input.trusted);
  if (peers.some((p) => p.layers)) {
    const explicit = planExplicit(nLayer, peers);
    if (typeof explicit !== 'string') {
      const partial = partialForWholeOnly(nLayer, peers, explicit);
      if (partial) return { ok: false, reason: `peer ${partial.peerId} asked for layers ${partial.shard.start}-${partial.shard.end} but serves this model only whole (0-${nLayer})` };
      const short = explicit.find((s) => input.shardBytes(s.shard) > (peers.find((p) => p.id === s.peerId)!.memoryBytes));
      if (!short) return { ok: true, stages: explicit };
      return { ok: false, reason: `peer ${short.peerId} asked for layers ${short.shard.start}-${short.shard.end} but its memory cannot hold them` };
    }
    const free = peers.filter((p) => !p.layers);
    if (free.length === 0) return { ok: false, reason: explicit };
    return planRoute({ ...input, peers: free });
  }
  // peers that already hold verified ranges which tile the model keep them (nothing to fetch)
  if (peers.some((p) => p.held)) {
    const held = planExplicit(nLayer, peers, 'held');
    if (typeof held !== 'string' && !partialForWholeOnly(nLayer, peers, held) && held.every((s) => input.shardBytes(s.shard) <= peers.find((p) => p.id === s.peerId)!.memoryBytes)) return { ok: true, stages: held };
  }
  // proportional over the peers that serve any range: try all, then drop the one with the least memory until shards fit
  const ranged = peers.filter((p) => !wholeOnly(p));
  let candidates = ranged.slice(0, Math.min(ranged.length, nLayer, input.maxStages ?? Infinity));
  while (candidates.length > 0) {
    const ranges = proportionalSplit(nLayer, candidates.map((p) => p.memoryBytes));
    const misfit = ranges.findIndex((r, i) => input.shardBytes(r) > candidates[i]!.memoryBytes);
    if (misfit < 0) return { ok: true, stages: ranges.map((shard, i) => ({ peerId: candidates[i]!.id, shard })) };
    const smallest = candidates.reduce((m, p) => (p.memoryBytes < m.memoryBytes ? p : m));
    candidates = candidates.filter((p) => p !== smallest);
  }
  // the whole model on one peer that serves it only whole
  const whole = { start: 0, end: nLayer };
  const single = peers.find((p) => wholeOnly(p) && input.shardBytes(whole) <= p.memoryBytes);
  if (single) return { ok: true, stages: [{ peerId: single.id, shard: whole }] };
  return { ok: false, reason: `the peers' memory (${peers.map((p) => `${p.memoryBytes}${wholeOnly(p) ? ' whole-model only' : ''}`).join(', ')} bytes) cannot hold the model` };
}
