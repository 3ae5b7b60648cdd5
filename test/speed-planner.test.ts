// The speed planner against brute force: on small random cases (peers of random speed, round
// trip and memory; a head on the last stage; embedding and head bytes) it finds the chain with
// the least predicted step time over every ordered subset of peers and every split of the
// layers, and is never slower than the memory-proportional split in join order.
import { describe, expect, it } from 'vitest';
import { MAX_EXACT_PEERS, planBySpeed, predictStepMs } from '../src/route/speed-planner.ts';
import type { PeerSpeedRecord, SpeedPlanInput } from '../src/route/speed-planner.ts';
import { planRoute } from '../src/route/planner.ts';
import type { PlannedStage } from '../src/route/planner.ts';
import type { ShardRange } from '../src/gguf/types.ts';
import { Prng } from '../src/model/prng.ts';

const LAYER = 100;
const bytesOf = (nLayer: number) => (r: ShardRange): number => (r.end - r.start) * LAYER + (r.start === 0 ? 30 : 0) + (r.end === nLayer ? 50 : 0);

/** Every ordered subset of `peers` with every composition of the layers: the least predicted time of a chain that fits. */
function bruteForce(input: SpeedPlanInput): number {
  let best = Infinity;
  const L = input.nLayer;
  const walk = (used: PeerSpeedRecord[], stages: PlannedStage[], at: number): void => {
    if (at === L) {
      best = Math.min(best, predictStepMs(input, stages));
      return;
    }
    for (const p of input.peers) {
      if (used.includes(p)) continue;
      for (let e = at + 1; e <= L; e++) {
        const shard = { start: at, end: e };
        if (input.shardBytes(shard) > p.memoryBytes) continue;
        walk([...used, p], [...stages, { peerId: p.id, shard }], e);
      }
    }
  };
  walk([], [], 0);
  return best;
}

function randomCase(rng: Prng, nPeers: number, nLayer: number): SpeedPlanInput {
  const peers: PeerSpeedRecord[] = [];
  for (let i = 0; i < nPeers; i++) {
    peers.push({
      id: `p${i}`,
      memoryBytes: LAYER * (1 + Math.floor(rng.next() * nLayer)) + 80,
      decodeMsPerLayer: 0.5 + rng.next() * 10,
      rttMs: rng.next() < 0.3 ? 40 + rng.next() * 100 : rng.next() * 5,
    });
  }
  return { nLayer, peers, shardBytes: bytesOf(nLayer), headLayers: 0.5 + rng.next(), hopOverheadMs: 0.2 };
}

describe('speed planner', () => {
  it('finds the brute-force optimum on small random cases', () => {
    const rng = new Prng(18);
    let solved = 0;
    for (let c = 0; c < 60; c++) {
      const input = randomCase(rng, 1 + (c % 4), 2 + (c % 6));
      const want = bruteForce(input);
      const got = planBySpeed(input);
      if (want === Infinity) {
        expect(got).toBeNull();
        continue;
      }
      solved++;
      expect(got).not.toBeNull();
      expect(got!.predictedMs).toBeCloseTo(predictStepMs(input, got!.stages), 9);
      expect(got!.predictedMs).toBeLessThanOrEqual(want * 1.000001); // the goal is within 10 %; the programme is exact
      // contiguous, complete, each peer once, each within its memory
      expect(got!.stages[0]!.shard.start).toBe(0);
      expect(got!.stages.at(-1)!.shard.end).toBe(input.nLayer);
      got!.stages.forEach((s, i) => i > 0 && expect(s.shard.start).toBe(got!.stages[i - 1]!.shard.end));
      expect(new Set(got!.stages.map((s) => s.peerId)).size).toBe(got!.stages.length);
      for (const s of got!.stages) expect(input.shardBytes(s.shard)).toBeLessThanOrEqual(input.peers.find((p) => p.id === s.peerId)!.memoryBytes);
    }
    expect(solved).toBeGreaterThan(30);
  });

  it('with a link matrix (peers far from each other, not from the server) it orders the chain by it', () => {
    const rng = new Prng(7);
    for (let c = 0; c < 20; c++) {
      const input = randomCase(rng, 3 + (c % 2), 4);
      const far = new Map<string, number>(); // one-way ms between each pair
      for (const a of input.peers) for (const b of input.peers) if (a.id < b.id) far.set(`${a.id}|${b.id}`, rng.next() * 60);
      const withLinks: SpeedPlanInput = { ...input, linkMs: (a, b) => far.get(a.id < b.id ? `${a.id}|${b.id}` : `${b.id}|${a.id}`) ?? 0 };
      const want = bruteForce(withLinks);
      const got = planBySpeed(withLinks);
      if (want === Infinity) continue;
      expect(got!.predictedMs).toBeLessThanOrEqual(want * 1.000001);
    }
  });

  it('is never slower than the memory-proportional split, and leaves out a peer too slow or too far to help', () => {
    const rng = new Prng(99);
    for (let c = 0; c < 40; c++) {
      const input = randomCase(rng, 2 + (c % 3), 6 + (c % 4));
      const mem = planRoute({ nLayer: input.nLayer, peers: input.peers.map((p) => ({ id: p.id, memoryBytes: p.memoryBytes })), shardBytes: input.shardBytes });
      const got = planBySpeed(input);
      if (!mem.ok) continue;
      expect(got!.predictedMs).toBeLessThanOrEqual(predictStepMs(input, mem.stages) * 1.000001);
    }
    // three equal peers and one 100 ms away: the far one is a spare; a slow one gets fewer layers
    const big = 1e9;
    const input: SpeedPlanInput = {
      nLayer: 12,
      shardBytes: bytesOf(12),
      peers: [
        { id: 'a', memoryBytes: big, decodeMsPerLayer: 1, rttMs: 1 },
        { id: 'far', memoryBytes: big, decodeMsPerLayer: 1, rttMs: 100 },
        { id: 'slow', memoryBytes: 6 * LAYER, decodeMsPerLayer: 4, rttMs: 1 },
        { id: 'b', memoryBytes: 7 * LAYER, decodeMsPerLayer: 1, rttMs: 1 },
      ],
    };
    const plan = planBySpeed(input)!;
    expect(plan.stages.map((s) => s.peerId)).not.toContain('far');
    const layers = (id: string): number => plan.stages.filter((s) => s.peerId === id).reduce((n, s) => n + s.shard.end - s.shard.start, 0);
    expect(layers('slow')).toBeLessThan(layers('a'));
  });

  it(`considers at most ${MAX_EXACT_PEERS} peers, the cheapest, and plans 64 layers over 8 peers quickly`, () => {
    const rng = new Prng(3);
    const input = randomCase(rng, 12, 64);
    const peers = input.peers.map((p) => ({ ...p, memoryBytes: 64 * LAYER + 80 }));
    const t0 = performance.now();
    const plan = planBySpeed({ ...input, peers })!;
    expect(performance.now() - t0).toBeLessThan(20_000); // a plan, not a benchmark: it must only finish
    expect(plan.stages.length).toBeLessThanOrEqual(MAX_EXACT_PEERS);
    expect(plan.stages.at(-1)!.shard.end).toBe(64);
  });
});
