import { describe, expect, it } from 'vitest';
import { planRoute, proportionalSplit } from '../src/route/planner.ts';
import type { ShardRange } from '../src/backends/types.ts';

const GiB = 1024 ** 3;
const perLayer = (bytes: number) => (r: ShardRange) => (r.end - r.start) * bytes;

describe('route planner', () => {
  it('splits layers in proportion to memory, contiguous and complete', () => {
    expect(proportionalSplit(8, [1, 1])).toEqual([{ start: 0, end: 4 }, { start: 4, end: 8 }]);
    expect(proportionalSplit(8, [1, 3])).toEqual([{ start: 0, end: 2 }, { start: 2, end: 8 }]);
    expect(proportionalSplit(5, [1, 2, 1])).toEqual([{ start: 0, end: 1 }, { start: 1, end: 4 }, { start: 4, end: 5 }]);
    // every stage gets at least one layer even with a tiny share
    expect(proportionalSplit(3, [100, 1, 1])).toEqual([{ start: 0, end: 1 }, { start: 1, end: 2 }, { start: 2, end: 3 }]);
  });

  it('plans over peers in join order', () => {
    const plan = planRoute({ nLayer: 5, peers: [{ id: 'a', memoryBytes: GiB }, { id: 'b', memoryBytes: 2 * GiB }, { id: 'c', memoryBytes: GiB }], shardBytes: perLayer(1000) });
    expect(plan).toEqual({ ok: true, stages: [
      { peerId: 'a', shard: { start: 0, end: 1 } },
      { peerId: 'b', shard: { start: 1, end: 4 } },
      { peerId: 'c', shard: { start: 4, end: 5 } },
    ] });
  });

  it('explicit --layers win when they tile the model', () => {
    const plan = planRoute({
      nLayer: 5,
      peers: [{ id: 'x', memoryBytes: GiB, layers: { start: 3, end: 5 } }, { id: 'y', memoryBytes: GiB, layers: { start: 0, end: 3 } }, { id: 'z', memoryBytes: 9 * GiB }],
      shardBytes: perLayer(1),
    });
    expect(plan).toEqual({ ok: true, stages: [{ peerId: 'y', shard: { start: 0, end: 3 } }, { peerId: 'x', shard: { start: 3, end: 5 } }] });
  });

  it('explains a gap in explicit ranges', () => {
    const plan = planRoute({ nLayer: 5, peers: [{ id: 'x', memoryBytes: GiB, layers: { start: 0, end: 2 } }], shardBytes: perLayer(1) });
    expect(plan.ok).toBe(false);
    if (!plan.ok) expect(plan.reason).toContain('starting at 2');
  });

  it('leaves out a peer whose memory cannot hold its shard', () => {
    const plan = planRoute({ nLayer: 4, peers: [{ id: 'small', memoryBytes: 100 }, { id: 'big', memoryBytes: 10_000 }], shardBytes: perLayer(1000) });
    expect(plan).toEqual({ ok: true, stages: [{ peerId: 'big', shard: { start: 0, end: 4 } }] });
    const none = planRoute({ nLayer: 4, peers: [{ id: 'small', memoryBytes: 100 }], shardBytes: perLayer(1000) });
    expect(none.ok).toBe(false);
  });

  it('uses at most one stage per layer', () => {
    const peers = Array.from({ length: 6 }, (_, i) => ({ id: `p${i}`, memoryBytes: GiB }));
    const plan = planRoute({ nLayer: 3, peers, shardBytes: perLayer(1) });
    expect(plan.ok && plan.stages.length).toBe(3);
  });

  it('prefers peers that already hold verified ranges tiling the model', () => {
    const plan = planRoute({
      nLayer: 5,
      peers: [{ id: 'new', memoryBytes: 8 * GiB }, { id: 'warmB', memoryBytes: GiB, held: { start: 2, end: 5 } }, { id: 'warmA', memoryBytes: GiB, held: { start: 0, end: 2 } }],
      shardBytes: perLayer(1),
    });
    expect(plan).toEqual({ ok: true, stages: [{ peerId: 'warmA', shard: { start: 0, end: 2 } }, { peerId: 'warmB', shard: { start: 2, end: 5 } }] });
    // held ranges that leave a gap fall back to the memory split over everyone
    const gap = planRoute({ nLayer: 5, peers: [{ id: 'a', memoryBytes: GiB, held: { start: 0, end: 2 } }, { id: 'b', memoryBytes: GiB }], shardBytes: perLayer(1) });
    expect(gap.ok && gap.stages.map((s) => s.peerId)).toEqual(['a', 'b']);
  });

  it('gives a whole-model-only peer every layer or nothing: never a partial range', () => {
    const whole = { id: 'w', memoryBytes: 9 * GiB, serves: 'whole-model' as const };
    // with peers that serve ranges, the split is theirs
    const split = planRoute({ nLayer: 4, peers: [whole, { id: 'a', memoryBytes: GiB }, { id: 'b', memoryBytes: GiB }], shardBytes: perLayer(1) });
    expect(split).toEqual({ ok: true, stages: [{ peerId: 'a', shard: { start: 0, end: 2 } }, { peerId: 'b', shard: { start: 2, end: 4 } }] });
    // alone (or when the range peers cannot hold the model) it serves all layers as one stage
    expect(planRoute({ nLayer: 4, peers: [whole], shardBytes: perLayer(1) })).toEqual({ ok: true, stages: [{ peerId: 'w', shard: { start: 0, end: 4 } }] });
    expect(planRoute({ nLayer: 4, peers: [{ id: 'tiny', memoryBytes: 1 }, whole], shardBytes: perLayer(1000) })).toEqual({ ok: true, stages: [{ peerId: 'w', shard: { start: 0, end: 4 } }] });
    // two whole-model-only peers are never split between them
    const two = planRoute({ nLayer: 4, peers: [{ ...whole, memoryBytes: 2000 }, { ...whole, id: 'w2', memoryBytes: 2000 }], shardBytes: perLayer(1000) });
    expect(two.ok).toBe(false);
    // asking for a partial range it cannot serve is explained
    const asked = planRoute({ nLayer: 4, peers: [{ ...whole, layers: { start: 0, end: 2 } }, { id: 'b', memoryBytes: GiB, layers: { start: 2, end: 4 } }], shardBytes: perLayer(1) });
    expect(asked.ok).toBe(false);
    if (!asked.ok) expect(asked.reason).toContain('only whole');
    // nor does a held partial range make it a stage
    const held = planRoute({ nLayer: 4, peers: [{ ...whole, held: { start: 0, end: 2 } }, { id: 'b', memoryBytes: GiB, held: { start: 2, end: 4 } }], shardBytes: perLayer(1) });
    expect(held.ok && held.stages).toEqual([{ peerId: 'b', shard: { start: 0, end: 4 } }]);
  });
});
