// Which peers can send a shard's bytes to a peer loading it (peer/shard-exchange.ts): browser
// tabs of the room that hold the whole range verified — advertised in their hello, served as a
// ready stage, or held as a ready spare's standby shard. The loading peer verifies every tensor
// itself and falls back to the server's model hosting, so a wrong guess costs only time.

import type { ShardRange } from '../src/gguf/types.ts';
import type { RoomHost } from './room-host.ts';
import type { Peer } from './room-peer.ts';

const covers = (held: ShardRange | undefined, want: ShardRange): boolean => held !== undefined && held.start <= want.start && held.end >= want.end;

/** Peers (not `loading` itself) holding `shard` verified, ready stages first. */
export function shardSources(room: RoomHost, loading: Peer, shard: ShardRange): string[] {
  const route = room.route;
  const out: string[] = [];
  for (const p of room.peers.values()) {
    if (p.id === loading.id || p.gone || p.hello.backend !== 'webgpu') continue;
    const stage = route?.stages.find((s) => s.peerId === p.id && s.status === 'ready');
    const spare = room.keeper.spares.get(p.id);
    if (covers(stage?.shard, shard)) out.unshift(p.id);
    else if ((spare?.status === 'ready' && covers(spare.shard, shard)) || covers(room.heldRangeOf(p), shard)) out.push(p.id);
  }
  return out;
}
