// Reading bytes of an artifact: from a local file (positioned fd reads) or from a URL (HTTP
// Range requests, nearby ranges coalesced into one request). Node modules are imported only
// on the file path, so browsers can use the URL path of this module. `ByteReader` is the raw layer
// (manifests and peers use it); `openTensorSource` puts a parsed header on top of it. A split
// GGUF reads as one artifact: `openArtifactReader` joins its files' readers into one address
// space, the parts concatenated in order (./split.ts).

import type { FileHandle } from 'node:fs/promises';
import { MeshError } from '../errors.ts';
import { isUrl } from './parse.ts';
import type { ReadHeaderOptions } from './parse.ts';
import { coalesceRanges } from './ranges.ts';
import { readArtifactHeader } from './split.ts';
import type { CoalesceOptions } from './ranges.ts';
import type { ByteRange, GgufHeader, TensorInfo, TensorSource } from './types.ts';

export interface ByteReaderStats {
  /** reads issued: HTTP requests for URLs, coalesced fd reads for files */
  requests: number;
  /** bytes received, gaps between coalesced ranges included */
  bytesRead: number;
}

export interface ByteReader {
  readonly location: string;
  readonly stats: ByteReaderStats;
  /**
   * Reads each range in full. Results are views that may share one buffer with their
   * neighbours. `labels[i]` (e.g. a tensor name) names range i in errors.
   */
  readRanges(ranges: readonly ByteRange[], labels?: readonly string[]): Promise<Uint8Array[]>;
  /** The whole content, front to back, in chunks (one pass; for hashing). */
  stream(): AsyncIterable<Uint8Array>;
  close(): Promise<void>;
}

export interface ByteReaderOptions extends CoalesceOptions {
  /** extra HTTP headers for URL locations */
  headers?: Record<string, string>;
  /** HTTP requests in flight at once (default 4) */
  concurrency?: number;
}

export async function openByteReader(location: string, opts: ByteReaderOptions = {}): Promise<ByteReader> {
  if (isUrl(location)) return new HttpByteReader(location, opts);
  let fh: FileHandle;
  try {
    const { open } = await import('node:fs/promises');
    fh = await open(location, 'r');
  } catch (e) {
    throw new MeshError('GGUF_NOT_FOUND', `cannot open ${location}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  return new FileByteReader(location, fh, opts);
}

/** One-shot helper: read these byte ranges of a file or URL. */
export async function readByteRanges(
  location: string,
  ranges: readonly ByteRange[],
  opts: ByteReaderOptions = {},
): Promise<Uint8Array[]> {
  const reader = await openByteReader(location, opts);
  try {
    return await reader.readRanges(ranges);
  } finally {
    await reader.close();
  }
}

function shortReadError(location: string, label: string, range: ByteRange, got: number): MeshError {
  return new MeshError(
    'SHORT_READ',
    `${location}: ${label} needs bytes [${range.offset}, ${range.offset + range.length}) but only ${got} of ${range.length} arrived`,
    { label, offset: range.offset, length: range.length, got },
  );
}

/** Slices a coalesced read into its parts, naming the first part that came up short. */
function splitParts(
  location: string,
  read: ReturnType<typeof coalesceRanges>[number],
  bytes: Uint8Array,
  ranges: readonly ByteRange[],
  labels: readonly string[] | undefined,
  out: Uint8Array[],
): void {
  for (const p of read.parts) {
    if (p.relOffset + p.length > bytes.length) {
      const got = Math.max(0, bytes.length - p.relOffset);
      throw shortReadError(location, labels?.[p.index] ?? `range ${p.index}`, ranges[p.index]!, got);
    }
    out[p.index] = bytes.subarray(p.relOffset, p.relOffset + p.length);
  }
}

class FileByteReader implements ByteReader {
  readonly stats: ByteReaderStats = { requests: 0, bytesRead: 0 };

  constructor(
    readonly location: string,
    private readonly fh: FileHandle,
    private readonly opts: ByteReaderOptions,
  ) {}

  async readRanges(ranges: readonly ByteRange[], labels?: readonly string[]): Promise<Uint8Array[]> {
    const out: Uint8Array[] = new Array(ranges.length);
    for (const read of coalesceRanges(ranges, this.opts)) {
      const buf = new Uint8Array(read.length);
      let filled = 0;
      while (filled < read.length) {
        const { bytesRead } = await this.fh.read(buf, filled, read.length - filled, read.offset + filled);
        if (bytesRead === 0) break; // end of file
        filled += bytesRead;
      }
      this.stats.requests++;
      this.stats.bytesRead += filled;
      splitParts(this.location, read, buf.subarray(0, filled), ranges, labels, out);
    }
    return out;
  }

  async *stream(): AsyncIterable<Uint8Array> {
    this.stats.requests++;
    const { createReadStream } = await import('node:fs');
    for await (const chunk of createReadStream(this.location, { highWaterMark: 1 << 20 })) {
      const bytes = chunk as Buffer;
      this.stats.bytesRead += bytes.length;
      yield new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length);
    }
  }

  async close(): Promise<void> {
    await this.fh.close();
  }
}

class HttpByteReader implements ByteReader {
  readonly stats: ByteReaderStats = { requests: 0, bytesRead: 0 };

  constructor(
    readonly location: string,
    private readonly opts: ByteReaderOptions,
  ) {}

  async readRanges(ranges: readonly ByteRange[], labels?: readonly string[]): Promise<Uint8Array[]> {
    const out: Uint8Array[] = new Array(ranges.length);
    const reads = coalesceRanges(ranges, this.opts);
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < reads.length) {
        const read = reads[next++]!;
        const bytes = read.length === 0 ? new Uint8Array(0) : await this.fetchRange(read);
        splitParts(this.location, read, bytes, ranges, labels, out);
      }
    };
    const workers = Math.max(1, Math.min(this.opts.concurrency ?? 4, reads.length));
    await Promise.all(Array.from({ length: workers }, worker));
    return out;
  }

  /** One Range request; returns what arrived (possibly short: the caller names the victim). */
  private async fetchRange(range: ByteRange): Promise<Uint8Array> {
    this.stats.requests++;
    let res: Response;
    try {
      res = await fetch(this.location, {
        headers: { ...this.opts.headers, Range: `bytes=${range.offset}-${range.offset + range.length - 1}` },
      });
    } catch (e) {
      throw new MeshError('HTTP_ERROR', `cannot fetch ${this.location}: ${(e as Error).message}`);
    }
    if (res.status === 200) {
      await res.body?.cancel();
      throw new MeshError(
        'RANGE_NOT_SUPPORTED',
        `${this.location}: the server ignored the Range request (status 200, not 206 Partial Content)`,
      );
    }
    if (res.status === 416) {
      await res.body?.cancel();
      return new Uint8Array(0); // the range starts past the end of the file
    }
    if (res.status !== 206) {
      await res.body?.cancel();
      throw new MeshError('HTTP_ERROR', `${this.location}: HTTP ${res.status} ${res.statusText}`, { status: res.status });
    }
    const start = res.headers.get('content-range')?.match(/bytes\s+(\d+)-/)?.[1];
    if (start !== undefined && Number(start) !== range.offset) {
      await res.body?.cancel();
      throw new MeshError(
        'RANGE_MISMATCH',
        `${this.location}: asked for bytes from ${range.offset}, the server sent bytes from ${start}`,
      );
    }
    const bytes = new Uint8Array(await res.arrayBuffer());
    this.stats.bytesRead += bytes.length;
    // a server may send more than asked; keep exactly the range
    return bytes.length > range.length ? bytes.subarray(0, range.length) : bytes;
  }

  async *stream(): AsyncIterable<Uint8Array> {
    this.stats.requests++;
    const res = await fetch(this.location, { headers: { ...this.opts.headers } });
    if (!res.ok || !res.body) {
      await res.body?.cancel();
      throw new MeshError('HTTP_ERROR', `${this.location}: HTTP ${res.status} ${res.statusText}`, { status: res.status });
    }
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      this.stats.bytesRead += chunk.length;
      yield chunk;
    }
  }

  async close(): Promise<void> {}
}

/**
 * One ByteReader over several files read back to back (a split GGUF's parts): offset 0 is the
 * first byte of the first file, file k starts at the sum of the sizes before it. A range that
 * crosses a file boundary is read from both files and joined.
 */
class ConcatByteReader implements ByteReader {
  readonly location: string;
  private readonly bases: number[] = [];

  constructor(
    private readonly parts: readonly ByteReader[],
    private readonly sizes: readonly number[],
  ) {
    this.location = parts[0]!.location;
    let base = 0;
    for (const size of sizes) {
      this.bases.push(base);
      base += size;
    }
  }

  get stats(): ByteReaderStats {
    return {
      requests: this.parts.reduce((a, p) => a + p.stats.requests, 0),
      bytesRead: this.parts.reduce((a, p) => a + p.stats.bytesRead, 0),
    };
  }

  async readRanges(ranges: readonly ByteRange[], labels?: readonly string[]): Promise<Uint8Array[]> {
    // cut each range at file boundaries (the last file is open-ended: past its end is a short read)
    const perFile = this.parts.map(() => ({ ranges: [] as ByteRange[], labels: [] as string[], owners: [] as Array<[number, number]> }));
    const pieces: number[] = ranges.map(() => 0);
    ranges.forEach((r, i) => {
      const end = r.offset + r.length;
      for (let f = 0; f < this.parts.length; f++) {
        const lo = this.bases[f]!;
        const hi = f === this.parts.length - 1 ? Infinity : lo + this.sizes[f]!;
        const from = Math.max(r.offset, lo);
        const to = Math.min(end, hi);
        if (to > from || (r.length === 0 && r.offset >= lo && r.offset < hi)) {
          perFile[f]!.ranges.push({ offset: from - lo, length: to - from });
          perFile[f]!.labels.push(labels?.[i] ?? `range ${i}`);
          perFile[f]!.owners.push([i, from - r.offset]);
          pieces[i]!++;
        }
      }
    });
    const got = await Promise.all(perFile.map((p, f) => (p.ranges.length ? this.parts[f]!.readRanges(p.ranges, p.labels) : Promise.resolve([]))));
    const out: Uint8Array[] = new Array(ranges.length);
    perFile.forEach((p, f) => {
      p.owners.forEach(([i, rel], k) => {
        const bytes = got[f]![k]!;
        if (pieces[i] === 1) out[i] = bytes;
        else (out[i] ??= new Uint8Array(ranges[i]!.length)).set(bytes, rel);
      });
    });
    return out;
  }

  async *stream(): AsyncIterable<Uint8Array> {
    for (const p of this.parts) yield* p.stream();
  }

  async close(): Promise<void> {
    await Promise.all(this.parts.map((p) => p.close()));
  }
}

/**
 * A reader of the artifact's bytes: one file, or the files of a split read as their
 * concatenation. `sizes` (bytes of each file, e.g. from the manifest) places the files.
 */
export async function openArtifactReader(locations: readonly string[], sizes: readonly number[], opts: ByteReaderOptions = {}): Promise<ByteReader> {
  if (locations.length !== sizes.length || locations.length === 0) {
    throw new MeshError('GGUF_BAD_SPLIT', `${locations.length} files but ${sizes.length} sizes`);
  }
  if (locations.length === 1) return openByteReader(locations[0]!, opts);
  const parts: ByteReader[] = [];
  try {
    for (const loc of locations) parts.push(await openByteReader(loc, opts));
  } catch (e) {
    await Promise.all(parts.map((p) => p.close()));
    throw e;
  }
  return new ConcatByteReader(parts, sizes);
}

export interface OpenTensorSourceOptions extends ReadHeaderOptions, ByteReaderOptions {}

/** A TensorSource that also exposes its byte reader (for raw reads and request counts). */
export interface ByteTensorSource extends TensorSource {
  readonly bytes: ByteReader;
}

/**
 * Parses the header at `location` and returns a source that reads tensors by byte range. Any
 * part of a split GGUF opens the whole artifact: the header has every part's tensors, at
 * offsets into the parts concatenated (./split.ts).
 */
export async function openTensorSource(location: string, opts: OpenTensorSourceOptions = {}): Promise<ByteTensorSource> {
  const art = await readArtifactHeader(location, opts);
  const bytes = await openArtifactReader(
    art.files.map((f) => f.location),
    art.files.map((f) => f.header.fileBytes),
    opts,
  );
  return tensorSourceOver(art.header, bytes);
}
/** Wraps an already-parsed header and a byte reader as a TensorSource. */
export function tensorSourceOver(header: GgufHeader, bytes: ByteReader): ByteTensorSource {
  return {
    header,
    location: bytes.location,
    bytes,
    async read(tensors: readonly TensorInfo[]): Promise<Map<string, Uint8Array>> {
      const data = await bytes.readRanges(
        tensors.map((t) => ({ offset: t.offset, length: t.byteLength })),
        tensors.map((t) => `tensor '${t.name}'`),
      );
      return new Map(tensors.map((t, i) => [t.name, data[i]!]));
    },
    close: () => bytes.close(),
  };
}
