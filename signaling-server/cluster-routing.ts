// Which instance of a cluster answers an HTTP request (cluster.ts): a room's endpoints and its
// completions are the room holder's, a route's the instance that made it (its id says which), a
// session's the instance that drives it (Redis records it). Everything else — model bytes,
// headers, manifests, /v1/models, health — any instance answers itself. A request whose body
// decides (a completion's `model` among several rooms, a session's opening frame) is read here
// once and handed on with that body.

import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import { HEADER_BYTES } from '../src/protocol/frame.ts';
import { readBody } from '../src/transport/http.ts';
import type { Cluster } from './cluster.ts';
import type { InstanceRecord } from './directory.ts';
import type { RoomRegistry } from './room-registry.ts';

/** The most a request body read here may be (a completion request, a session frame). */
const MAX_PEEKED_BODY = 4 * 1024 * 1024;

export interface RequestOwner {
  /** the instance that answers; null: this one */
  target: InstanceRecord | null;
  /** the room the request is for, where it names one */
  roomId?: string;
  /** the body, when it was read to decide */
  body?: Buffer;
  /** a completion request (its body read) */
  completion?: boolean;
}

/** The request again, its body already read: what answers it here reads the same bytes. */
export function replayed(req: IncomingMessage, body: Buffer): IncomingMessage {
  const r = Readable.from([body], { objectMode: false }) as unknown as IncomingMessage;
  return Object.assign(r, { method: req.method, url: req.url, headers: req.headers, socket: req.socket, httpVersion: req.httpVersion });
}

export async function ownerOfRequest(cluster: Cluster, registry: RoomRegistry, req: IncomingMessage, path: string): Promise<RequestOwner> {
  const rooms = registry.rooms;
  const room = /^\/v1\/rooms\/([^/]+)(\/|$)/.exec(path);
  if (room) return rooms.some((r) => r.id === room[1]) ? { target: await cluster.holderOf(room[1]!), roomId: room[1]! } : { target: null };
  const route = /^\/v1\/routes\/(\d+)$/.exec(path);
  if (route) return { target: await cluster.instanceOfRoute(Number(route[1])) };
  const session = /^\/v1\/sessions\/([0-9a-f]{32})(\/|$)/.exec(path);
  if (session) {
    const sid = session[1]!;
    if (registry.sessions.state(sid) !== undefined) return { target: null };
    const driver = await cluster.instanceOfSession(sid);
    if (driver) return { target: driver };
    if (req.method !== 'POST') return { target: null };
    // an opening frame: the route it names says which instance runs it
    const body = await readBody(req, MAX_PEEKED_BODY);
    if (body.length < HEADER_BYTES) return { target: null, body };
    return { target: await cluster.instanceOfRoute(body.readUInt32LE(8)), body };
  }
  if (req.method === 'POST' && (path === '/v1/chat/completions' || path === '/v1/completions')) {
    // read here: a completion passed on is kept alive across its holder's death (resumable-completion.ts)
    const body = await readBody(req, MAX_PEEKED_BODY);
    if (rooms.length === 1) return { target: await cluster.holderOf(rooms[0]!.id), roomId: rooms[0]!.id, body, completion: true };
    let model: unknown;
    try {
      model = (JSON.parse(body.toString('utf8')) as { model?: unknown }).model;
    } catch {
      return { target: null, body }; // refused here, as it would be anywhere
    }
    const named = rooms.find((r) => r.model.id === model || r.id === model);
    return named ? { target: await cluster.holderOf(named.id), roomId: named.id, body, completion: true } : { target: null, body };
  }
  return { target: null };
}
