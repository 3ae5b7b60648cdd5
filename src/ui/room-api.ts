// The page's view of a room over the signaling server's HTTP API (Bearer = the room secret):
// the room summary, its peers and its route with each stage's telemetry.

import { MeshError } from '../errors.ts';
import { parseJoinUrl } from '../protocol/control.ts';

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

export interface RouteSummary {
  id: number;
  status: string;
  reason: string | null;
  stages: StageSummary[];
}

/** Reads a room link; the secret may also be given apart from the URL. */
export function roomLink(url: string, secret?: string | null): RoomLink {
  const p = parseJoinUrl(url);
  const key = secret || p.secret;
  if (!key) throw new MeshError('AUTH_FAILED', 'the room link carries no secret (#secret=…)');
  return { base: p.base, roomId: p.roomId, secret: key, joinUrl: `${p.base}/room/${p.roomId}#secret=${encodeURIComponent(key)}` };
}

export async function getJson<T>(link: RoomLink, path: string, signal?: AbortSignal): Promise<T> {
  let res: Response;
  try {
    res = await fetch(`${link.base}${path}`, { headers: { authorization: `Bearer ${link.secret}` }, ...(signal ? { signal } : {}) });
  } catch (e) {
    throw new MeshError('SERVER_UNREACHABLE', `cannot reach the signaling server at ${link.base}: ${(e as Error).message}`);
  }
  const body = (await res.json().catch(() => ({}))) as T & { error?: { code: string; message: string } };
  if (!res.ok) throw MeshError.fromWire(body.error?.code ?? 'HTTP_ERROR', body.error?.message ?? `${path}: HTTP ${res.status}`);
  return body;
}

export const fetchRoom = (link: RoomLink): Promise<RoomSummary> => getJson<RoomSummary>(link, `/v1/rooms/${link.roomId}`);
export const fetchPeers = (link: RoomLink): Promise<{ peers: PeerSummary[] }> => getJson(link, `/v1/rooms/${link.roomId}/peers`);
export const fetchRoute = (link: RoomLink, id: number): Promise<RouteSummary> => getJson<RouteSummary>(link, `/v1/routes/${id}`);
