// Reads a GGUF header (local file or http(s) URL) with @huggingface/gguf and turns it into
// our GgufHeader: metadata, every tensor's ABSOLUTE byte range, and the file's size. The
// library parses; this module names what is wrong when a file is not usable.
//
// The library reads a zero-padded window, so a file cut inside its header parses as zeros
// instead of failing: we catch that by comparing where the header ends with the file size.

import { gguf } from '@huggingface/gguf';
import { MeshError } from '../errors.ts';
import { traitsOf } from './traits.ts';
import type { GgmlType, GgufHeader, MetadataValue, TensorInfo } from './types.ts';

export { traitsOf };

// Node-only modules are imported where used, so browsers can parse URLs with this module.

const GGUF_MAGIC = [0x47, 0x47, 0x55, 0x46]; // "GGUF"
/** magic + version + tensor count + kv count, for v2/v3 */
const MIN_HEADER_BYTES = 24;
const DEFAULT_ALIGNMENT = 32;

export function isUrl(location: string): boolean {
  return /^https?:\/\//i.test(location);
}

export interface ReadHeaderOptions {
  /**
   * Accept tensors whose bytes lie past the end of the file (a header-only copy, as the
   * audit command reads). Their offsets are still computed; reading them will fail.
   */
  allowTruncatedData?: boolean;
  /** extra HTTP headers for URL locations */
  headers?: Record<string, string>;
}

/** Parses the header of a GGUF v2/v3 file at a local path or an http(s) URL. */
export async function readHeader(location: string, opts: ReadHeaderOptions = {}): Promise<GgufHeader> {
  const remote = isUrl(location);
  // for URLs the size arrives with the first ranged response (Content-Range: bytes a-b/total)
  const probe: { fileBytes: number | undefined; firstBytes: Uint8Array | undefined } = {
    fileBytes: undefined,
    firstBytes: undefined,
  };
  if (!remote) probe.fileBytes = await localFileSize(location);

  let parsed: Awaited<ReturnType<typeof gguf>> & { typedMetadata: Record<string, { type: number; subType?: number }> };
  try {
    parsed = await gguf(
      location,
      remote
        ? { fetch: rangeCheckingFetch(location, probe), additionalFetchHeaders: opts.headers ?? {}, typedMetadata: true }
        : { allowLocalFile: true, typedMetadata: true },
    );
  } catch (e) {
    if (e instanceof MeshError) throw e;
    throw await translateParseError(e as Error, location, remote, probe);
  }

  let fileBytes = probe.fileBytes;
  if (fileBytes === undefined) fileBytes = await remoteSizeByHead(location, opts.headers);

  const version = Number(parsed.metadata.version);
  if (version !== 2 && version !== 3) {
    throw new MeshError('GGUF_BAD_VERSION', `${location}: GGUF version ${version} is not supported (only v2 and v3)`);
  }
  if (!parsed.littleEndian) {
    throw new MeshError('GGUF_BAD_VERSION', `${location}: big-endian GGUF files are not supported`);
  }
  const headerEnd = parsed.tensorInfoByteRange[1];
  if (headerEnd > fileBytes) {
    throw new MeshError(
      'GGUF_TRUNCATED_HEADER',
      `${location}: the header needs ${headerEnd} bytes but the file has only ${fileBytes}`,
    );
  }

  const metadata: Record<string, MetadataValue> = {};
  const metadataTypes: Record<string, string> = {};
  for (const [key, value] of Object.entries(parsed.metadata)) {
    if (key === 'version' || key === 'tensor_count' || key === 'kv_count') continue;
    metadata[key] = value as MetadataValue;
    const typed = parsed.typedMetadata[key];
    const name = typed && VALUE_TYPE_NAMES[typed.type];
    if (name) metadataTypes[key] = name === 'array' ? `array:${VALUE_TYPE_NAMES[typed.subType ?? -1] ?? 'unknown'}` : name;
  }
  // the library keeps the last of two equal keys; llama.cpp refuses the file
  const kvCount = Number(parsed.metadata.kv_count);
  if (Object.keys(metadata).length !== kvCount) {
    throw new MeshError('GGUF_MALFORMED_HEADER', `${location}: the header has ${kvCount} metadata keys but only ${Object.keys(metadata).length} distinct ones (a key appears twice)`);
  }
  const alignment = metadata['general.alignment'] === undefined ? DEFAULT_ALIGNMENT : Number(metadata['general.alignment']);
  if (!Number.isInteger(alignment) || alignment < 1 || (alignment & (alignment - 1)) !== 0 || alignment > 1 << 20) {
    throw new MeshError('GGUF_MALFORMED_HEADER', `${location}: general.alignment ${String(metadata['general.alignment'])} is not a power of two`);
  }
  const tensorDataOffset = toSafeNumber(parsed.tensorDataOffset, location, 'tensor data offset');
  const tensors = tensorsOf(parsed.tensorInfos, location, tensorDataOffset, alignment);

  if (!opts.allowTruncatedData) {
    for (const t of tensors) {
      if (t.offset + t.byteLength > fileBytes) {
        throw new MeshError(
          'GGUF_DATA_PAST_EOF',
          `${location}: tensor '${t.name}' occupies bytes [${t.offset}, ${t.offset + t.byteLength}) but the file ends at ${fileBytes}`,
          { tensor: t.name, end: t.offset + t.byteLength, fileBytes },
        );
      }
    }
  }

  return { version, metadata, tensors, tensorDataOffset, alignment, fileBytes, metadataTypes };
}

type LibraryTensorInfo = Awaited<ReturnType<typeof gguf>>['tensorInfos'][number];

/**
 * Tensor infos with absolute byte ranges, refused as llama.cpp's gguf reader refuses them: an
 * unknown type, a row that is not whole blocks, two tensors with one name, or a tensor not at
 * the offset where the previous one ends (padded to the alignment) — which also rules out
 * gaps, overlaps and reordering. Nothing is allocated per element.
 */
function tensorsOf(infos: LibraryTensorInfo[], location: string, tensorDataOffset: number, alignment: number): TensorInfo[] {
  const names = new Set<string>();
  let expected = 0;
  return infos.map((t) => {
    if (names.has(t.name)) throw new MeshError('GGUF_BAD_TENSOR', `${location}: two tensors are named '${t.name}'`, { tensor: t.name });
    names.add(t.name);
    const type = Number(t.dtype);
    const traits = traitsOf(type);
    if (!traits) {
      throw new MeshError('GGUF_UNKNOWN_TYPE', `${location}: tensor '${t.name}' has unknown ggml type id ${type}`);
    }
    const shape = t.shape.map((d) => toSafeNumber(d, location, `dimension of '${t.name}'`));
    const nElements = shape.reduce((a, b) => a * b, 1);
    if (!Number.isSafeInteger(nElements) || (shape[0] ?? 1) % traits.blockSize !== 0) {
      throw new MeshError(
        'GGUF_BAD_TENSOR',
        `${location}: tensor '${t.name}' has rows of ${shape[0]} elements, not a whole number of ${traits.name} blocks of ${traits.blockSize}`,
        { tensor: t.name },
      );
    }
    const relative = toSafeNumber(t.offset, location, `offset of '${t.name}'`);
    if (relative % alignment !== 0) {
      throw new MeshError('GGUF_BAD_TENSOR', `${location}: tensor '${t.name}' offset ${relative} is not aligned to ${alignment}`, { tensor: t.name });
    }
    if (relative !== expected) {
      throw new MeshError('GGUF_BAD_TENSOR', `${location}: tensor '${t.name}' has offset ${relative}, expected ${expected} (tensors lie in header order, each where the previous one ends, padded to ${alignment})`, { tensor: t.name });
    }
    const byteLength = (nElements / traits.blockSize) * traits.typeSize;
    expected += Math.ceil(byteLength / alignment) * alignment;
    return { name: t.name, type: type as GgmlType, shape, nElements, offset: tensorDataOffset + relative, byteLength };
  });
}

/** gguf.h `enum gguf_type` ids → the writer's type names */
const VALUE_TYPE_NAMES: readonly string[] = ['uint8', 'int8', 'uint16', 'int16', 'uint32', 'int32', 'float32', 'bool', 'string', 'array', 'uint64', 'int64', 'float64'];

async function localFileSize(path: string): Promise<number> {
  try {
    const { stat } = await import('node:fs/promises'); // dynamic: this module also runs in browsers (URLs only)
    const s = await stat(path);
    if (!s.isFile()) throw new MeshError('GGUF_NOT_FOUND', `${path} is not a regular file`);
    return s.size;
  } catch (e) {
    if (e instanceof MeshError) throw e;
    throw new MeshError('GGUF_NOT_FOUND', `cannot open ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}

/**
 * A fetch for the library that insists on partial content: a server that ignores Range
 * would otherwise hand it the whole file as if it were the first window. It also records the
 * file size from Content-Range and the first bytes (to tell a short file from a foreign one).
 */
function rangeCheckingFetch(
  location: string,
  probe: { fileBytes: number | undefined; firstBytes: Uint8Array | undefined },
): typeof fetch {
  return async (input, init) => {
    let res: Response;
    try {
      res = await fetch(input, init);
    } catch (e) {
      throw new MeshError('HTTP_ERROR', `cannot fetch ${location}: ${(e as Error).message}`);
    }
    const total = parseContentRangeTotal(res.headers.get('content-range'));
    if (total !== undefined) probe.fileBytes = total;
    if (res.status === 416) {
      // a window starting at or past the end: hand the library no bytes; our size check decides
      await res.body?.cancel();
      return new Response(new Uint8Array(0), { status: 206 });
    }
    if (res.status === 200) {
      await res.body?.cancel();
      throw new MeshError(
        'RANGE_NOT_SUPPORTED',
        `${location}: the server ignored the Range request (status 200, not 206 Partial Content)`,
      );
    }
    if (res.status !== 206) {
      await res.body?.cancel();
      throw new MeshError('HTTP_ERROR', `${location}: HTTP ${res.status} ${res.statusText}`, { status: res.status });
    }
    const bytes = new Uint8Array(await res.arrayBuffer());
    if (probe.firstBytes === undefined) probe.firstBytes = bytes.subarray(0, MIN_HEADER_BYTES);
    return new Response(bytes, { status: 206, headers: res.headers });
  };
}

export function parseContentRangeTotal(header: string | null): number | undefined {
  const m = header?.match(/\/\s*(\d+)\s*$/);
  if (!m) return undefined;
  const n = Number(m[1]);
  return Number.isSafeInteger(n) ? n : undefined;
}

async function remoteSizeByHead(location: string, headers?: Record<string, string>): Promise<number> {
  const res = await fetch(location, { method: 'HEAD', headers: headers ?? {} });
  const len = Number(res.headers.get('content-length'));
  if (!res.ok || !Number.isSafeInteger(len) || res.headers.get('content-length') === null) {
    throw new MeshError('HTTP_ERROR', `${location}: the server reported no file size (no Content-Range total, HEAD gave ${res.status})`);
  }
  return len;
}

async function readFirstBytes(location: string, n: number): Promise<Uint8Array> {
  const { open } = await import('node:fs/promises');
  const fh = await open(location, 'r');
  try {
    const buf = new Uint8Array(n);
    const { bytesRead } = await fh.read(buf, 0, n, 0);
    return buf.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}

/** Maps the library's plain Errors to our codes, using the file size to spot truncation. */
async function translateParseError(
  e: Error,
  location: string,
  remote: boolean,
  probe: { fileBytes: number | undefined; firstBytes: Uint8Array | undefined },
): Promise<MeshError> {
  const first = remote ? (probe.firstBytes ?? new Uint8Array(0)) : await readFirstBytes(location, MIN_HEADER_BYTES);
  const size = probe.fileBytes ?? first.length;
  const magicPrefix = first.length > 0 && first.every((b, i) => i >= 4 || b === GGUF_MAGIC[i]);
  if (size < MIN_HEADER_BYTES && magicPrefix) {
    return new MeshError('GGUF_TRUNCATED_HEADER', `${location}: only ${size} bytes, shorter than a GGUF header (${MIN_HEADER_BYTES})`);
  }
  if (first.length >= 8 && magicPrefix) {
    // the library parses v1 with 32-bit counts and fails somewhere later: name the real cause
    const version = new DataView(first.buffer, first.byteOffset, first.length).getUint32(4, true);
    if (version !== 2 && version !== 3) {
      return new MeshError('GGUF_BAD_VERSION', `${location}: GGUF version ${version} is not supported (only v2 and v3)`);
    }
  }
  if (/magic number/.test(e.message)) {
    return new MeshError('GGUF_NOT_GGUF', `${location} is not a GGUF file (it does not start with the bytes 'GGUF')`);
  }
  if (/unsupported version/.test(e.message)) {
    const m = e.message.match(/"(\d+)"/);
    return new MeshError('GGUF_BAD_VERSION', `${location}: GGUF version ${m?.[1] ?? '?'} is not supported (only v2 and v3)`);
  }
  return new MeshError('GGUF_MALFORMED_HEADER', `${location}: malformed GGUF header: ${e.message}`);
}

function toSafeNumber(v: bigint | number, location: string, what: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new MeshError('GGUF_MALFORMED_HEADER', `${location}: ${what} ${String(v)} is out of range`);
  }
  return n;
}
