// What the room's helpers see of it (peer-memory.ts, public-room.ts, route-repair.ts,
// shard-sources.ts, stage-policy.ts): its peers, its current route, the artifact it hosts, and
// the few things they may ask of it. room.ts implements RoomHost; the helpers import this
// module instead of room.ts, so none of them ties back to the room itself.

import type { GgufHeader, ShardRange } from '../src/gguf/types.ts';
import type { PeerHello, ServerToPeer } from '../src/protocol/control.ts';
import type { SessionManager } from '../src/route/sessions.ts';
import type { Spare } from './repair-state.ts';
import type { Peer } from './room-peer.ts';
import type { Route, RouteOwner } from './room-route.ts';

export interface ModelArtifact {
  id: string;
  /** local path, or the URL peers read */
  location: string;
  /** the artifact header: a split GGUF's parts joined, tensors at offsets into the parts concatenated */
  header: GgufHeader;
  nLayer: number;
  /** files of the artifact (a split GGUF has several; peers derive their URLs from modelUrl's name) */
  files: number;
  /** the model's training context: no session declares more */
  contextLength?: number;
}

/** How a stage reaches the next stage's peer (an assignment's or a rewire's fields). */
export type Downstream = { downstream: string | null; downstreamPeer: string | null; downstreamRtc: boolean };

export interface RoomHost extends RouteOwner {
  readonly model: ModelArtifact;
  readonly route: Route | null;
  /** the keeper's spares and who may take a stage (route-repair.ts) */
  readonly keeper: RouteOwner['keeper'] & { readonly spares: Map<string, Spare>; eligible(p: Peer): boolean };
  readonly sessions: Pick<SessionManager, 'stageLost' | 'settled' | 'routeRepaired'>;
  send(peer: Peer, msg: ServerToPeer): void;
  schedulePlan(): void;
  /** `peer` can no longer serve its stage: repair the route, or degrade and replan */
  stageGone(peer: Peer, why: string): void;
  excludePeer(peer: Peer, reason: string): void;
  heldRangeOf(p: Peer): ShardRange | undefined;
  mayServeStage(p: Peer, r: Route, stage: number, as?: 'stage' | 'standby'): boolean;
  leaveDone(peerId: string, moved: boolean): void;
  modelUrlFor(peer: Peer | undefined): string;
  downstreamOf(peerId: string | null, hello: PeerHello | undefined): Downstream;
  connectEntry(r: Route): Promise<void>;
  assignStage(r: Route, stage: number, peer: Peer): void;
  shardBytes(range: ShardRange): number;
}
