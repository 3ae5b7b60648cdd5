// A client whose completion stream broke (its instance killed, its connection cut) sends the same
// request again, to any instance, with the standard SSE `Last-Event-ID` header naming the last
// event it read (`<completion id>:<text offset>`, stream-journal.ts). The journal in Redis says
// which room the stream is of, which request it answers and with which seed; the request is
// asked again of the room's holder — as resumable-completion.ts asks again when a holder dies
// under a stream it passed on — and the client gets only what comes after the text it has,
// under the same id, then [DONE]. A stream journaled nowhere (no --redis), expired, or asked with
// another body is refused by name.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { MeshError } from '../src/errors.ts';
import type { Grant } from './access.ts';
import type { Cluster } from './cluster.ts';
import type { LinkTrust, RoomLinks } from './instance-link.ts';
import { resumableCompletion } from './resumable-completion.ts';
import { bodyDigest } from './stream-journal.ts';

/** Whether `req` asks to resume a stream (a completion POST with Last-Event-ID). */
export function asksResume(req: IncomingMessage, path: string): boolean {
  return req.method === 'POST' && (path === '/v1/completions' || path === '/v1/chat/completions') && req.headers['last-event-id'] !== undefined;
}

/** `<completion id>:<text offset>` read from Last-Event-ID; RESUME_BAD_EVENT_ID when it is not one this server wrote. */
export function parseEventId(v: string): { id: string; offset: number } {
  const m = /^((?:chat)?cmpl-[0-9a-f]{24}):(\d{1,9})$/.exec(v.trim());
  if (!m) throw new MeshError('RESUME_BAD_EVENT_ID', `Last-Event-ID ${JSON.stringify(v.slice(0, 80))} is not an event id of this server's streams (<completion id>:<offset>)`);
  return { id: m[1]!, offset: Number(m[2]) };
}

export interface ResumeContext {
  cluster: Cluster | null;
  grant: Grant;
  trust: LinkTrust;
  links?: RoomLinks;
}

/** Resumes the stream Last-Event-ID names for the client of `req`, whose body (`raw`) is read. */
export async function resumeStream(req: IncomingMessage, res: ServerResponse, path: string, raw: Buffer, ctx: ResumeContext): Promise<void> {
  const { id, offset } = parseEventId(String(req.headers['last-event-id']));
  const { cluster } = ctx;
  if (!cluster) throw new MeshError('RESUME_UNKNOWN', `stream ${id}: this server keeps no journal of its streams (serve --redis does); send the request again without Last-Event-ID`);
  if (id.startsWith('chatcmpl-') !== (path === '/v1/chat/completions')) throw new MeshError('RESUME_MISMATCH', `stream ${id} is not one of ${path}`);
  const rec = await cluster.directory.journalRead(id).catch((e: Error) => {
    throw new MeshError('REDIS_UNREACHABLE', `stream ${id}: the journal cannot be read (${e.message})`);
  });
  // a stream of a room this credential does not open is, to it, no stream at all
  if (!rec || !ctx.grant.rooms.some((r) => r.id === rec.roomId)) throw new MeshError('RESUME_UNKNOWN', `stream ${id} is unknown or expired: send the request again without Last-Event-ID`);
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(raw.toString('utf8')) as Record<string, unknown>;
  } catch {
    throw new MeshError('BODY_NOT_JSON', 'the request body is not JSON');
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body) || bodyDigest(body) !== rec.digest || (body.seed !== undefined && body.seed !== null && body.seed !== rec.seed)) {
    throw new MeshError('RESUME_MISMATCH', `stream ${id} answers another request: a reconnect sends the same body as the request that opened it`);
  }
  if (offset > rec.text.length) throw new MeshError('RESUME_BEYOND', `stream ${id}: event ${offset} is past the ${rec.text.length} characters it was sent`, { recorded: rec.text.length });
  cluster.log(`stream ${id}: resumed at ${offset} of ${rec.text.length} characters`);
  const parsed = { body: { ...body, seed: rec.seed }, stream: true };
  await resumableCompletion(cluster, rec.roomId, req, res, null, parsed, ctx.trust, ctx.links, { sent: rec.text.slice(0, offset), id });
}
