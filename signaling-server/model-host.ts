// Serves model files with HTTP Range support (GET/HEAD, one range per request: 206 with
// Content-Range, 416 when unsatisfiable) and records which byte ranges each client fetched,
// so tests can prove a peer read only its shard.

import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { MeshError } from '../src/errors.ts';
import { PEER_HEADER } from '../src/transport/link.ts';

/**
 * A hosted model file, opened once when its room opens: every read goes through this
 * descriptor, so re-pointing a symlink or renaming another file into the path changes nothing
 * served; a file changed in place (size, mtime or inode) is refused, MODEL_CHANGED.
 */
export class PinnedFile {
  private constructor(
    readonly path: string,
    private readonly fh: FileHandle,
    private readonly pinned: { ino: number; dev: number; size: number; mtimeMs: number },
  ) {}

  static async open(path: string): Promise<PinnedFile> {
    const fh = await open(path, 'r');
    const st = await fh.stat();
    return new PinnedFile(path, fh, { ino: st.ino, dev: st.dev, size: st.size, mtimeMs: st.mtimeMs });
  }

  get size(): number {
    return this.pinned.size;
  }

  /** MODEL_CHANGED when the opened file is no longer the one the room's manifest describes. */
  async check(): Promise<void> {
    const st = await this.fh.stat();
    const p = this.pinned;
    if (st.ino !== p.ino || st.dev !== p.dev || st.size !== p.size || st.mtimeMs !== p.mtimeMs) {
      throw new MeshError('MODEL_CHANGED', `${this.path} changed on disk under a running room (size ${p.size} → ${st.size}); restart serve to host the new file`);
    }
  }

  /** The bytes [start, end] (inclusive), read at their positions from the pinned descriptor. */
  stream(start: number, end: number): NodeJS.ReadableStream {
    return createReadStream('', { fd: this.fh.fd, start, end, autoClose: false, emitClose: false });
  }

  close(): Promise<void> {
    return this.fh.close();
  }
}

export interface RangeFetch {
  /** the peer id from `x-mesh-peer`, else the client's address:port */
  client: string;
  /** which file of the artifact (0 unless it is a split GGUF) */
  file: number;
  /** inclusive byte range [start, end] within that file */
  start: number;
  end: number;
  at: number;
}

export class FetchLog {
  readonly entries: RangeFetch[] = [];
  add(e: RangeFetch): void {
    this.entries.push(e);
    if (this.entries.length > 100_000) this.entries.shift(); // bounded: a log, not a store
  }
  /** bytes each client fetched; `ranges` are within each file, `files[i]` says which file range i read */
  byClient(): Record<string, { requests: number; bytes: number; ranges: Array<[number, number]>; files: number[] }> {
    const out: Record<string, { requests: number; bytes: number; ranges: Array<[number, number]>; files: number[] }> = {};
    for (const e of this.entries) {
      const c = (out[e.client] ??= { requests: 0, bytes: 0, ranges: [], files: [] });
      c.requests++;
      c.bytes += e.end - e.start + 1;
      c.ranges.push([e.start, e.end]);
      c.files.push(e.file);
    }
    return out;
  }
}

/** Parses a single `bytes=` range against `size`; null = unsatisfiable, undefined = no/ignored range. */
export function parseRange(header: string | undefined, size: number): { start: number; end: number } | null | undefined {
  if (!header) return undefined;
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m) return header.trim().startsWith('bytes=') && header.includes(',') ? undefined : null; // multiple ranges: serve whole file
  const [, a, b] = m;
  if (a === '' && b === '') return null;
  let start: number;
  let end: number;
  if (a === '') {
    const suffix = Number(b);
    if (suffix === 0) return null;
    start = Math.max(0, size - suffix);
    end = size - 1;
  } else {
    start = Number(a);
    end = b === '' ? size - 1 : Math.min(Number(b), size - 1);
  }
  if (start >= size || start > end) return null;
  return { start, end };
}

export async function serveFile(req: IncomingMessage, res: ServerResponse, pinned: PinnedFile, log: FetchLog, file = 0): Promise<void> {
  await pinned.check();
  const size = pinned.size;
  const client = (req.headers[PEER_HEADER] as string | undefined) ?? `${req.socket.remoteAddress}:${req.socket.remotePort}`;
  const range = parseRange(req.headers.range, size);
  const head = req.method === 'HEAD';
  const common = { 'accept-ranges': 'bytes', 'content-type': 'application/octet-stream' };
  if (range === null) {
    res.writeHead(416, { ...common, 'content-range': `bytes */${size}` });
    res.end();
    return;
  }
  const { start, end } = range ?? { start: 0, end: size - 1 };
  const headers = { ...common, 'content-length': String(size === 0 ? 0 : end - start + 1), ...(range ? { 'content-range': `bytes ${start}-${end}/${size}` } : {}) };
  res.writeHead(range ? 206 : 200, headers);
  if (head || size === 0) {
    res.end();
    return;
  }
  log.add({ client, file, start, end, at: Date.now() });
  pinned.stream(start, end).on('error', () => res.destroy()).pipe(res);
}
