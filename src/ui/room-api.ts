// The page's view of a room over the signaling server's HTTP API (Bearer = the room secret):
// the room summary, its peers and its route with each stage's telemetry.

import { MeshError } from '../errors.ts';
import { parseJoinUrl } from '../protocol/control.ts';
import { fetchJson } from '../transport/server-json.ts';

export interface RoomLink {
  /** http(s)://host:port of the signaling server */
  base: string;
  roomId: string;
  secret: string;
  /** the link to share: …/room/<id>#secret=… (the secret only ever in the fragment) */
  joinUrl: string;
}

export interface RoomSummary {
  id: string;
  model: { id: string; url: string; nLayer: number; fileBytes: number };
  peers: number;
  route: { id: number; status: string; reason: string | null } | null;
}

export interface PeerSummary {
  id: string;
  backend: string;
  memoryBytes: number;
  name?: string;
  adapter?: { vendor?: string; architecture?: string; description?: string; isFallbackAdapter?: boolean } | null;
  stage: number | null;
  stageStatus: string | null;
}

export interface StageSummary {
  stage: number;
  peerId: string;
  shard: { start: number; end: number };
  status: string;
  loadMs?: number;
  bytesRead?: number;
  error?: { code: string; message: string };
  telemetry?: Record<string, unknown>;
  peer: PeerSummary | null;
}

/** A peer outside the route holding a standby shard, ready to take over its stage. */
export interface SpareSummary {
  peerId: string;
  stage: number;
  shard: { start: number; end: number };
  status: 'loading' | 'ready' | 'failed';
}

export interface RouteSummary {
  id: number;
  status: string;
  reason: string | null;
  stages: StageSummary[];
  spares?: SpareSummary[];
  /** a repair under way: when it began and the stages that lost their peer */
  repair?: { since: number; stages: number[]; lost: Array<{ stage: number; lostPeer: string; cause: string; replacement: string | null; warm: boolean; phase: string }> } | null;
}

/** Reads a room link; the secret may also be given apart from the URL. */
export function roomLink(url: string, secret?: string | null): RoomLink {
  const p = parseJoinUrl(url);
  const key = secret || p.secret;
  if (!key) throw new MeshError('AUTH_FAILED', 'the room link carries no secret (#secret=…)');
  return { base: p.base, roomId: p.roomId, secret: key, joinUrl: `${p.base}/room/${p.roomId}#secret=${encodeURIComponent(key)}` };
}

const getJson = <T>(link: RoomLink, path: string): Promise<T> => fetchJson<T>(`${link.base}${path}`, link.secret, { unreachableCode: 'SERVER_UNREACHABLE' });

export const fetchRoom = (link: RoomLink): Promise<RoomSummary> => getJson<RoomSummary>(link, `/v1/rooms/${link.roomId}`);
export const fetchPeers = (link: RoomLink): Promise<{ peers: PeerSummary[] }> => getJson(link, `/v1/rooms/${link.roomId}/peers`);
export const fetchRoute = (link: RoomLink, id: number): Promise<RouteSummary> => getJson<RouteSummary>(link, `/v1/routes/${id}`);
