// A route speculates only where every stage takes FrameFlag.Verify and the model keeps no
// recurrent state: a Gated DeltaNet layer's state after a frame cannot drop the rejected drafts
// at its end (qwen35, qwen35moe), so its routes decode plainly.
import { describe, expect, it } from 'vitest';
import type { GgufHeader } from '../src/gguf/types.ts';
import { Route } from '../signaling-server/room-route.ts';
import type { RouteOwner } from '../signaling-server/room-route.ts';
import type { Peer } from '../signaling-server/room-peer.ts';

function routeOf(architecture: string, verify: boolean[]): Route {
  const peers = new Map(verify.map((v, i) => [`p${i}`, { id: `p${i}`, hello: { verify: v, directReturn: true } } as unknown as Peer]));
  const owner: RouteOwner = {
    id: 'room',
    model: { id: 'm', header: { metadata: { 'general.architecture': architecture } } as unknown as GgufHeader, nLayer: verify.length },
    peers,
    keeper: { summary: () => [] },
    log: () => undefined,
    emit: () => undefined,
    probeStages: async () => undefined,
    peerSummary: () => null,
  };
  const stages = verify.map((_, i) => ({ stage: i, peerId: `p${i}`, shard: { start: i, end: i + 1 }, status: 'ready' as const, listen: null }));
  return new Route(1, owner, stages);
}

describe('which routes speculate', () => {
  it('a transformer whose every stage takes Verify', () => {
    expect(routeOf('llama', [true, true, true]).verify()).toBe(true);
    expect(routeOf('qwen3moe', [true, true]).verify()).toBe(true);
  });
  it('not when one stage does not take it (the PyTorch peer)', () => {
    expect(routeOf('llama', [true, false, true]).verify()).toBe(false);
  });
  it('not a model with recurrent layers, whatever its stages take', () => {
    expect(routeOf('qwen35', [true, true]).verify()).toBe(false);
    expect(routeOf('qwen35moe', [true]).verify()).toBe(false);
  });
});
