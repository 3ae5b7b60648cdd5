// The planner that knows speed and links: given each peer's measured decode cost per layer, its
// round trip to the server and its memory, it picks the chain — which peers, in which order,
// which contiguous layer ranges — that minimises the predicted time per token, under memory
// limits. Peers too slow or too far to help are left out (they stay spares).
//
// The model of one decode step on the one-way token path (N stages, N + 1 hops):
//   T = hop(server, p₀) + Σₖ layersₖ · msPerLayerₖ + head · msPerLayer_last
//       + Σₖ hop(pₖ, pₖ₊₁) + hop(p_last, server) + (N + 1) · hopOverheadMs
// where hop(a, b) is the one-way latency between two peers: `linkMs(a, b)` when the caller
// knows it, else (rtt_a + rtt_b) / 2 (a star through the server's network), and hop(server, a) =
// rtt_a / 2. It is solved exactly by a dynamic programme over (peers used, last peer, layers
// covered): O(2^P · P² · L²) for P candidate peers and L layers, so at most MAX_EXACT_PEERS
// peers take part (the fastest by their predicted cost for an even share of the layers).

import type { ShardRange } from '../gguf/types.ts';
import type { PlannedStage } from './planner.ts';

/** What the planner knows of one peer: the record budgets and calibrations fill in. */
export interface PeerSpeedRecord {
  id: string;
  /** bytes the peer offers for weights (its budget) */
  memoryBytes: number;
  /** measured decode cost of one layer for one token (ms): calibration at join, then live steps' (signaling-server/live-speed.ts) */
  decodeMsPerLayer: number;
  /** round trip between the server and the peer (ms): the least of its control socket's recent heartbeats */
  rttMs: number;
}

export interface SpeedPlanInput {
  nLayer: number;
  /** in join order */
  peers: readonly PeerSpeedRecord[];
  /** bytes of tensor data shard `range` needs (the embedding on the first stage, the head on the last) */
  shardBytes: (range: ShardRange) => number;
  /** the output norm and head's decode cost, in layers of the last stage's speed (default 0) */
  headLayers?: number;
  /** fixed cost of each hop besides its latency: framing, a socket's wake-up (ms; default 0.2) */
  hopOverheadMs?: number;
  /** one-way latency between two peers when known (ms); default (rtt_a + rtt_b) / 2 */
  linkMs?: (a: PeerSpeedRecord, b: PeerSpeedRecord) => number;
}

export interface SpeedPlan {
  stages: PlannedStage[];
  /** the model's predicted decode time per token (ms) */
  predictedMs: number;
}

/** Most peers the exact programme considers (2^P states). */
export const MAX_EXACT_PEERS = 8;

const DEFAULT_HOP_OVERHEAD_MS = 0.2;

/** The one-way latency between two peers through the server's network (the star), from their round trips to it (ms). */
export const starLinkMs = (a: { rttMs: number }, b: { rttMs: number }): number => (a.rttMs + b.rttMs) / 2;

/** The model's predicted decode step (ms) of a chain. */
export function predictStepMs(input: SpeedPlanInput, stages: readonly PlannedStage[]): number {
  const byId = new Map(input.peers.map((p) => [p.id, p]));
  const chain = stages.map((s) => byId.get(s.peerId)!);
  const over = input.hopOverheadMs ?? DEFAULT_HOP_OVERHEAD_MS;
  const link = input.linkMs ?? starLinkMs;
  let t = chain[0]!.rttMs / 2 + chain[chain.length - 1]!.rttMs / 2 + (chain.length + 1) * over;
  stages.forEach((s, i) => {
    t += (s.shard.end - s.shard.start) * chain[i]!.decodeMsPerLayer;
    if (i > 0) t += link(chain[i - 1]!, chain[i]!);
  });
  return t + (input.headLayers ?? 0) * chain[chain.length - 1]!.decodeMsPerLayer;
}

/** The chain with the least predicted step time whose shards fit every peer's memory; null when none fits. */
export function planBySpeed(input: SpeedPlanInput): SpeedPlan | null {
  const L = input.nLayer;
  const peers = candidates(input);
  const P = peers.length;
  if (P === 0 || L < 1) return null;
  const over = input.hopOverheadMs ?? DEFAULT_HOP_OVERHEAD_MS;
  const link = input.linkMs ?? starLinkMs;
  const fits = fitTable(input, peers);
  // best[mask][last][l]: least time of a chain using `mask`, ending with peer `last`, covering layers [0, l)
  const size = (1 << P) * P * (L + 1);
  const best = new Float64Array(size).fill(Infinity);
  const from = new Int32Array(size).fill(-1); // previous state's index
  const at = (mask: number, last: number, l: number): number => (mask * P + last) * (L + 1) + l;
  for (let j = 0; j < P; j++) {
    for (let e = 1; e <= L; e++) {
      if (!fits[j]![0]![e]) continue;
      best[at(1 << j, j, e)] = peers[j]!.rttMs / 2 + over + e * peers[j]!.decodeMsPerLayer;
    }
  }
  for (let mask = 1; mask < 1 << P; mask++) {
    for (let last = 0; last < P; last++) {
      if (!(mask & (1 << last))) continue;
      for (let l = 1; l < L; l++) {
        const here = best[at(mask, last, l)]!;
        if (here === Infinity) continue;
        for (let j = 0; j < P; j++) {
          if (mask & (1 << j)) continue;
          const hop = link(peers[last]!, peers[j]!) + over;
          for (let e = l + 1; e <= L; e++) {
            if (!fits[j]![l]![e]) continue;
            const t = here + hop + (e - l) * peers[j]!.decodeMsPerLayer;
            const k = at(mask | (1 << j), j, e);
            if (t < best[k]!) {
              best[k] = t;
              from[k] = at(mask, last, l);
            }
          }
        }
      }
    }
  }
  // close every chain that covers all layers with the head and the hop back to the server
  let bestEnd = -1;
  let bestT = Infinity;
  for (let mask = 1; mask < 1 << P; mask++) {
    for (let last = 0; last < P; last++) {
      const k = at(mask, last, L);
      const t = best[k]! + peers[last]!.rttMs / 2 + over + (input.headLayers ?? 0) * peers[last]!.decodeMsPerLayer;
      if (t < bestT) {
        bestT = t;
        bestEnd = k;
      }
    }
  }
  if (bestEnd < 0) return null;
  const stages: PlannedStage[] = [];
  for (let k = bestEnd; k >= 0; k = from[k]!) {
    const l = k % (L + 1);
    const last = Math.floor(k / (L + 1)) % P;
    const prev = from[k]!;
    stages.unshift({ peerId: peers[last]!.id, shard: { start: prev >= 0 ? prev % (L + 1) : 0, end: l } });
  }
  return { stages, predictedMs: bestT };
}

/** The peers the programme considers: all, or the MAX_EXACT_PEERS with the least cost of an even share. */
function candidates(input: SpeedPlanInput): PeerSpeedRecord[] {
  const usable = input.peers.filter((p) => Number.isFinite(p.decodeMsPerLayer) && p.decodeMsPerLayer >= 0 && Number.isFinite(p.rttMs) && p.rttMs >= 0);
  if (usable.length <= MAX_EXACT_PEERS) return usable;
  const share = input.nLayer / MAX_EXACT_PEERS;
  const cost = (p: PeerSpeedRecord): number => share * p.decodeMsPerLayer + p.rttMs;
  const kept = new Set([...usable].sort((a, b) => cost(a) - cost(b)).slice(0, MAX_EXACT_PEERS));
  return usable.filter((p) => kept.has(p)); // join order kept
}

/** fits[j][s][e]: peer j's memory holds shard [s, e). */
function fitTable(input: SpeedPlanInput, peers: readonly PeerSpeedRecord[]): boolean[][][] {
  const L = input.nLayer;
  const bytes: number[][] = [];
  for (let s = 0; s < L; s++) {
    bytes.push([]);
    for (let e = 0; e <= L; e++) bytes[s]!.push(e > s ? input.shardBytes({ start: s, end: e }) : Infinity);
  }
  return peers.map((p) => bytes.map((row) => row.map((b) => b <= p.memoryBytes)));
}
