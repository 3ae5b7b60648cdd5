// What a client was sent of a streamed completion, kept where any instance can read it (serve
// --redis), so that a client whose stream broke — its instance killed, its connection cut — can
// reconnect to any instance with the standard SSE `Last-Event-ID` and get the rest
// (stream-resume.ts). Every event of a stream carries `id: <completion id>:<offset>`, the length
// of the text the client has once it read that event. The journal is written ahead: an event
// carrying text goes out only once Redis holds that text, so whatever id a client last saw, the
// record covers it. Writes are batched: text waits up to JOURNAL_BATCH_MS for more, and one write
// is in flight at a time, carrying everything produced while the last one was out — a stream's
// text reaches its client that much later, and a fast stream costs Redis a write per batch, not
// per token. The record is the request's digest, the seed it runs with, its room and the text;
// it expires a while after its last write and is removed when the stream ends.

import { createHash } from 'node:crypto';

/** A record lives this long after its last write: the time a client has to reconnect. */
export const JOURNAL_TTL_MS = 5 * 60_000;
/** How long text waits for more before it is written: the most a journal delays a stream (beside one round trip to Redis). */
export const JOURNAL_BATCH_MS = 20;

export interface JournalMeta {
  roomId: string;
  /** bodyDigest of the request as the client sent it */
  digest: string;
  /** the seed the completion runs with (the client's, or the one chosen for it) */
  seed: number;
}

export interface JournalRecord extends JournalMeta {
  /** the text released to the client so far */
  text: string;
}

/** Where records live (Directory in Redis). */
export interface JournalStore {
  journalBegin(id: string, meta: JournalMeta, text: string, ttlMs: number): Promise<void>;
  journalAppend(id: string, text: string, ttlMs: number): Promise<void>;
  journalRead(id: string): Promise<JournalRecord | null>;
  journalDrop(id: string): Promise<void>;
}

/** The digest a resumed request must match: the body with its keys sorted, without `seed` (one the server chose is not the client's). */
export function bodyDigest(body: Record<string, unknown>): string {
  const { seed: _seed, ...rest } = body;
  const canonical = (v: unknown): unknown =>
    Array.isArray(v) ? v.map(canonical) : v && typeof v === 'object' ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical((v as Record<string, unknown>)[k])])) : v;
  return createHash('sha256').update(JSON.stringify(canonical(rest))).digest('hex');
}

/** The content a streamed chunk adds (completions: `text`; chat: `delta.content`). */
export function pieceOf(chunk: unknown): string {
  const c = (chunk as { choices?: Array<{ text?: string; delta?: { content?: string | null } }> } | null)?.choices?.[0];
  return c?.text ?? c?.delta?.content ?? '';
}

/** Strips the `id:` lines of an event (a stream passed on gets this instance's ids). */
export function withoutId(block: string): string {
  return block.replace(/^id:.*(\n|$)/gm, '');
}

/**
 * One stream's events on their way to the client: numbered, and — with a store — released
 * only once the journal holds their text. Without a store (no --redis) the events still carry
 * ids, written at once.
 */
export class StreamJournal {
  private id: string | null = null;
  private offset: number;
  /** event blocks waiting for their text to be recorded, and that text */
  private queue: string[] = [];
  private pendingText = '';
  private inflight: Promise<void> | null = null;
  private store: JournalStore | null;
  private drained: (() => void) | null = null;
  private batch: NodeJS.Timeout | null = null;

  /**
   * `resumed`: the text the client already has of a stream it reconnected to (its record is
   * cut back to it). The id is given now or, for a stream passed on, by its first chunk.
   */
  constructor(
    store: JournalStore | null,
    private readonly meta: JournalMeta | null,
    private readonly write: (s: string) => void,
    private readonly onStoreError: (e: Error) => void = () => undefined,
    private readonly resumed: string = '',
  ) {
    this.store = meta ? store : null;
    this.offset = resumed.length;
  }

  /** The stream's id, once known: the record is begun under it (a resumed one cut back to what the client has). */
  setId(id: string): void {
    if (this.id !== null) return;
    this.id = id;
    if (this.store) this.track(this.store.journalBegin(id, this.meta!, this.resumed, JOURNAL_TTL_MS));
  }

  /** An SSE event (its `event:`/`data:` lines, no blank line) adding `piece` to the client's text. */
  event(block: string, piece = ''): void {
    this.offset += piece.length;
    const line = `${this.id !== null ? `id: ${this.id}:${this.offset}\n` : ''}${block}\n\n`;
    if (!this.store || this.id === null || (piece === '' && this.queue.length === 0 && this.inflight === null)) return this.write(line);
    this.queue.push(line);
    this.pendingText += piece;
    this.kick();
  }

  /** Once every event is out: the record is dropped when the stream ended for good (`done`), kept for a reconnect otherwise. */
  async close(done: boolean): Promise<void> {
    if (this.inflight || this.queue.length) await new Promise<void>((r) => (this.drained = r));
    if (done && this.store && this.id !== null) await this.store.journalDrop(this.id).catch((e: Error) => this.onStoreError(e));
  }

  private track(write: Promise<void>): void {
    const count = this.queue.length;
    this.inflight = write
      .then(() => this.release(count))
      .catch((e: Error) => {
        // Redis failed: the stream goes on unrecorded rather than stall
        this.store = null;
        this.onStoreError(e);
        this.release(this.queue.length);
      })
      .finally(() => {
        this.inflight = null;
        this.kick();
      });
  }

  private release(count: number): void {
    for (const line of this.queue.splice(0, count)) this.write(line);
  }

  private kick(): void {
    if (this.inflight || this.batch) return;
    if (this.store && this.pendingText) {
      this.batch = setTimeout(() => {
        this.batch = null;
        this.flush();
      }, JOURNAL_BATCH_MS);
      return;
    }
    this.release(this.queue.length);
    this.drained?.();
    this.drained = null;
  }

  private flush(): void {
    if (this.store && this.pendingText) {
      const text = this.pendingText;
      this.pendingText = '';
      return this.track(this.store.journalAppend(this.id!, text, JOURNAL_TTL_MS));
    }
    this.kick();
  }
}
