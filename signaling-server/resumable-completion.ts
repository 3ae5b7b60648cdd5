// A completion this instance passed on to the room's holder, kept alive when the holder dies
// mid-reply (cluster.ts). The request is made reproducible before it leaves — a seed is added
// when it names none — so the room's next holder, asked the same request, generates the same
// tokens: greedy or seeded sampling is deterministic on every backend. When the holder's answer
// breaks off, this instance waits for the room to pass on (the lease expires, the peers rejoin,
// a route is planned), asks again, and passes on only what the client has not seen: a streamed
// reply continues where it stopped, under the same id; a whole reply is simply the second
// answer. The client sees a pause, not an error. A reply that comes back different from what
// was already sent ends the stream with an error event rather than splice two texts.
//
// Taken on: completions and chat completions with n = 1 and no tools (a call's argument deltas
// are not text to line up). Everything else is passed on as before. What the client is sent is
// journaled (stream-journal.ts) under the stream's id, so a client that loses this instance
// reconnects elsewhere with Last-Event-ID and resumes here, from the journal (stream-resume.ts).

import { randomInt } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { MeshError } from '../src/errors.ts';
import { sendError, SSE_HEAD } from '../src/transport/http.ts';
import type { Cluster } from './cluster.ts';
import type { InstanceRecord } from './directory.ts';
import { answerHeaders, resend } from './instance-link.ts';
import type { LinkTrust, RoomLinks } from './instance-link.ts';
import { bodyDigest, pieceOf, StreamJournal, withoutId } from './stream-journal.ts';

/** How long a broken-off completion waits for its room to come back before it fails. */
export const RESUME_DEADLINE_MS = 60_000;

interface Parsed {
  body: Record<string, unknown>;
  stream: boolean;
}

/** The request, made reproducible, when it is one this module keeps alive; null otherwise. */
export function resumableBody(raw: Buffer): Parsed | null {
  let body: unknown;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch {
    return null;
  }
  return reproducible(body);
}

/** A parsed request object made reproducible (a seed where it names none), when it is one a stream can be resumed of; null otherwise. */
export function reproducible(body: unknown): Parsed | null {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return null;
  const b = body as Record<string, unknown>;
  if ((b.n !== undefined && b.n !== 1) || (b.tools !== undefined && b.tools !== null) || b.echo === true) return null;
  // the same seed asked again gives the same tokens; without one the second answer would differ
  return { body: b.seed === undefined || b.seed === null ? { ...b, seed: randomInt(0, 2 ** 31) } : b, stream: b.stream === true };
}

/** What the client has of a streamed reply: its text so far and the stream's id (null before the first chunk). */
export interface Seen {
  sent: string;
  id: string | null;
}

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  stream: IncomingMessage;
}

function ask(req: IncomingMessage, target: InstanceRecord, proof: string, body: Buffer, trust: LinkTrust, onRequest: (abort: () => void) => void): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const out = resend(req, target, proof, trust, body, (res) => resolve({ status: res.statusCode ?? 502, headers: res.headers, stream: res }));
    out.on('error', reject);
    onRequest(() => out.destroy(new MeshError('ROOM_ELSEWHERE', 'the room moved to this instance')));
    out.end(body);
  });
}

/**
 * Passes a completion on to the room's holder, and asks again — of the room's next holder —
 * when the answer breaks off. Resolves once the client has its whole answer, or an error.
 * `first`: the holder to ask first (null: whichever holds the room once one does); `seen`:
 * what the client already has of the stream, when it reconnected to resume it.
 */
export async function resumableCompletion(cluster: Cluster, roomId: string, req: IncomingMessage, res: ServerResponse, first: InstanceRecord | null, parsed: Parsed, trust: LinkTrust = {}, links?: RoomLinks, seen: Seen = { sent: '', id: null }): Promise<void> {
  const body = Buffer.from(JSON.stringify(parsed.body));
  let clientGone = false;
  res.on('close', () => (clientGone = !res.writableFinished));
  const journal = parsed.stream
    ? new StreamJournal(cluster.directory, { roomId, digest: bodyDigest(parsed.body), seed: parsed.body.seed as number }, (s) => void (res.writableEnded || res.write(s)), (e) => cluster.log(`journaling a stream failed: ${e.message}`), seen.sent)
    : null;
  if (seen.id) journal?.setId(seen.id);
  let target: InstanceRecord | null = first;
  const deadline = Date.now() + RESUME_DEADLINE_MS;
  for (let attempt = 0; ; attempt++) {
    if (clientGone) return;
    let answer: Answer | null = null;
    // the room coming to this instance ends the request to its old holder (dead or frozen): asked again here
    let remove = (): void => undefined;
    try {
      target ??= (await cluster.holderOf(roomId)) ?? cluster.record;
      const to = target;
      answer = await ask(req, to, cluster.linkProof(), body, trust, (abort) => {
        if (to.id !== cluster.id) remove = links?.add(roomId, abort) ?? remove;
      });
    } catch {
      answer = null;
    }
    if (answer && answer.status === 200) {
      const done = journal ? await relayStream(answer, res, seen, journal) : await relayWhole(answer, res);
      remove();
      if (done !== 'broke') {
        if (journal) await journal.close(true).then(() => res.end());
        return;
      }
    } else if (answer && attempt === 0 && answer.status < 500) {
      // refused for what it is (a bad parameter, the credential): the client gets that refusal
      return relayWhole(answer, res).then(() => undefined);
    } else answer?.stream.resume();
    remove();
    if (Date.now() > deadline) {
      const err = new MeshError('ROOM_ELSEWHERE', `room ${roomId}: its holder went away mid-reply and no instance took the room over within ${RESUME_DEADLINE_MS / 1000} s`);
      if (!res.headersSent) return sendError(res, err);
      journal?.event(`event: error\ndata: ${JSON.stringify({ error: { code: err.code, message: err.message } })}`);
      await journal?.close(true);
      return void res.end();
    }
    target = null; // the room's next holder, once there is one
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** A whole (not streamed) answer: passed on if it came whole; 'broke' if it broke off first. */
function relayWhole(answer: Answer, res: ServerResponse): Promise<'done' | 'broke'> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    answer.stream.on('data', (c: Buffer) => parts.push(c));
    answer.stream.on('end', () => {
      if (!answer.stream.complete) return resolve('broke');
      res.writeHead(answer.status, answerHeaders(answer.stream));
      res.end(Buffer.concat(parts));
      resolve('done');
    });
    answer.stream.on('error', () => resolve('broke'));
    answer.stream.on('aborted', () => resolve('broke'));
  });
}

/**
 * A streamed answer, event by event: the first answer's events go on as they come; a second
 * answer's are passed on from where the client's text stops (their id rewritten to the first's).
 * They reach the client through the journal, under this instance's event ids.
 */
function relayStream(answer: Answer, res: ServerResponse, seen: Seen, journal: StreamJournal): Promise<'done' | 'broke'> {
  return new Promise((resolve) => {
    const resumed = seen.id !== null;
    /** this answer's text so far */
    let text = '';
    let buffer = '';
    let finished = false;
    if (!res.headersSent) res.writeHead(200, SSE_HEAD);
    const pass = (raw: string): void => {
      const event = withoutId(raw);
      const data = /^data: (.*)$/m.exec(event)?.[1];
      if (data === undefined || data === '[DONE]' || /^event: error/m.test(event)) {
        // the end, or the holder's own error (a stage lost for good): final either way
        if (data === '[DONE]' || /^event: error/m.test(event)) finished = true;
        journal.event(event);
        return;
      }
      let chunk: Record<string, unknown> & { id?: string; choices?: Array<Record<string, unknown>> };
      try {
        chunk = JSON.parse(data) as typeof chunk;
      } catch {
        return void journal.event(event);
      }
      seen.id ??= chunk.id ?? null;
      if (seen.id) {
        chunk.id = seen.id;
        journal.setId(seen.id);
      }
      const piece = pieceOf(chunk);
      const before = text.length;
      text += piece;
      if (resumed && before < seen.sent.length) {
        // the part the client already has: it must be the same text, and is not sent again
        if (!(text.length <= seen.sent.length ? seen.sent.startsWith(text) : text.startsWith(seen.sent))) {
          const err = new MeshError('RESUME_DIVERGED', "the room's new holder generated a different continuation; the reply stops here");
          journal.event(`event: error\ndata: ${JSON.stringify({ error: { code: err.code, message: err.message } })}`);
          finished = true;
          answer.stream.destroy();
          return;
        }
        if (text.length <= seen.sent.length) return; // wholly seen
        const rest = text.slice(seen.sent.length);
        const c = chunk.choices![0]!;
        if (typeof c.text === 'string') c.text = rest;
        else (c.delta as { content?: string }).content = rest;
      } else if (resumed && piece === '' && !chunk.choices?.[0]?.finish_reason && !chunk.usage && !chunk.gguf_mesh) return; // a second role chunk
      const added = text.length > seen.sent.length ? text.slice(seen.sent.length) : '';
      if (added) seen.sent = text;
      journal.event(`data: ${JSON.stringify(chunk)}`, added);
    };
    res.once('close', () => answer.stream.destroy());
    answer.stream.setEncoding('utf8');
    answer.stream.on('data', (c: string) => {
      buffer += c;
      for (let i = buffer.indexOf('\n\n'); i >= 0; i = buffer.indexOf('\n\n')) {
        pass(buffer.slice(0, i));
        buffer = buffer.slice(i + 2);
      }
    });
    // a stream destroyed here (diverged) ends final; one cut off elsewhere is asked again
    const over = (): void => resolve(finished ? 'done' : 'broke');
    for (const e of ['end', 'aborted', 'error', 'close']) answer.stream.on(e, over);
  });
}
