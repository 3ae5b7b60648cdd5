// The manifest's schema, and checking bytes against a manifest, in browsers and in Node alike (SubtleCrypto, which Node
// 20 also has as globalThis.crypto). No peer computes with bytes it has not verified: read the
// tensors of a shard with `readVerifiedTensors`, which re-fetches a mismatching tensor once
// and then refuses it with TENSOR_HASH_MISMATCH naming the tensor and both hashes.

import { MeshError } from '../errors.ts';
import type { HyperParameters, TensorGroup } from './summary.ts';
import type { GgmlType, TensorInfo, TensorSource } from './types.ts';

export const MANIFEST_SCHEMA_VERSION = 1;
const SUPPORTED_SCHEMA = MANIFEST_SCHEMA_VERSION;

/** One file of the artifact (a split GGUF has several, in part order). No names or paths: the
 *  manifest depends only on the bytes, so a renamed or re-hosted copy has the same manifest. */
export interface ManifestFile {
  size: number;
  sha256: string;
}

export interface ManifestTensor {
  name: string;
  /** ggml type name, e.g. 'Q4_K' */
  type: string;
  /** ggml type id */
  type_id: number;
  /** ggml order: shape[0] is the contiguous dimension */
  shape: number[];
  /** index into `artifact.files` */
  file: number;
  /** absolute byte offset within its file */
  offset: number;
  byte_length: number;
  sha256: string;
}

export interface Manifest {
  schema_version: number;
  artifact: {
    /** sha256 of the artifact's bytes (all files concatenated in order); the artifact's id */
    sha256: string;
    /** total bytes of all files */
    size: number;
    files: ManifestFile[];
  };
  architecture: string;
  hyper_parameters: HyperParameters;
  /** sum of byte_length over all tensors (alignment padding excluded) */
  tensor_data_bytes: number;
  tensors: ManifestTensor[];
  /** shard units: embed, layer.0 … layer.{n-1}, head, and global when present */
  groups: TensorGroup[];
}


/** sha256 of bytes, lower-case hex, via SubtleCrypto. */
export async function sha256HexAsync(bytes: Uint8Array): Promise<string> {
  // copy when the view does not own its whole buffer: digest() takes a BufferSource
  const view = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? bytes : bytes.slice();
  const digest = await globalThis.crypto.subtle.digest('SHA-256', view as Uint8Array<ArrayBuffer>);
  let hex = '';
  for (const b of new Uint8Array(digest)) hex += b.toString(16).padStart(2, '0');
  return hex;
}

/** Parses and sanity-checks a manifest received as text (or already-parsed JSON). */
export function parseManifest(input: string | unknown): Manifest {
  let m: unknown;
  try {
    m = typeof input === 'string' ? JSON.parse(input) : input;
  } catch (e) {
    throw new MeshError('BAD_MANIFEST', `manifest is not JSON: ${(e as Error).message}`);
  }
  const man = m as Partial<Manifest>;
  if (!man || typeof man !== 'object' || man.schema_version !== SUPPORTED_SCHEMA) {
    throw new MeshError('BAD_MANIFEST', `manifest schema_version ${String(man?.schema_version)} is not supported (expected ${SUPPORTED_SCHEMA})`);
  }
  if (!man.artifact || !/^[0-9a-f]{64}$/.test(man.artifact.sha256 ?? '') || !Array.isArray(man.tensors) || !Array.isArray(man.groups)) {
    throw new MeshError('BAD_MANIFEST', 'manifest lacks artifact.sha256, tensors or groups');
  }
  for (const t of man.tensors) {
    if (typeof t.name !== 'string' || !/^[0-9a-f]{64}$/.test(t.sha256) || !Number.isSafeInteger(t.offset) || !Number.isSafeInteger(t.byte_length)) {
      throw new MeshError('BAD_MANIFEST', `manifest entry for tensor '${String(t.name)}' is malformed`);
    }
  }
  return man as Manifest;
}

/** Names of the groups a stage serving layers [start, end) holds. */
export function shardGroupNames(manifest: Manifest, start: number, end: number): string[] {
  const nLayer = manifest.hyper_parameters.n_layer;
  if (!(Number.isInteger(start) && Number.isInteger(end) && 0 <= start && start < end && end <= nLayer)) {
    throw new MeshError('BAD_SHARD', `shard [${start}, ${end}) is not a layer range of a ${nLayer}-layer model`);
  }
  const names: string[] = [];
  if (start === 0) names.push('embed');
  for (let i = start; i < end; i++) names.push(`layer.${i}`);
  if (end === nLayer) names.push('head');
  if (manifest.groups.some((g) => g.name === 'global')) names.push('global');
  return names;
}

/** Manifest entries of every tensor a stage serving [start, end) needs (tied embeddings included). */
export function shardTensors(manifest: Manifest, start: number, end: number): ManifestTensor[] {
  const wanted = new Set<string>();
  for (const name of shardGroupNames(manifest, start, end)) {
    const g = manifest.groups.find((x) => x.name === name);
    if (!g) continue;
    for (const t of g.tensors) wanted.add(t);
    for (const t of g.uses) wanted.add(t);
  }
  return manifest.tensors.filter((t) => wanted.has(t.name));
}

/**
 * Where a tensor starts in the artifact's bytes (all files concatenated in order), the
 * addressing of a split artifact's joined header and of `openArtifactReader`.
 */
export function artifactOffset(manifest: Manifest, entry: ManifestTensor): number {
  let base = 0;
  for (let f = 0; f < entry.file; f++) base += manifest.artifact.files[f]!.size;
  return base + entry.offset;
}

/** A manifest entry as the TensorInfo a TensorSource reads. */
export function tensorInfoOf(entry: ManifestTensor): TensorInfo {
  return {
    name: entry.name,
    type: entry.type_id as GgmlType,
    shape: [...entry.shape],
    nElements: entry.shape.reduce((a, b) => a * b, 1),
    offset: entry.offset,
    byteLength: entry.byte_length,
  };
}

function entryOf(manifest: Manifest, name: string): ManifestTensor {
  const entry = manifest.tensors.find((t) => t.name === name);
  if (!entry) throw new MeshError('UNKNOWN_TENSOR', `tensor '${name}' is not in the manifest of artifact ${manifest.artifact.sha256}`);
  return entry;
}

function mismatch(entry: ManifestTensor, actual: string, actualBytes: number): MeshError {
  return new MeshError(
    'TENSOR_HASH_MISMATCH',
    `tensor '${entry.name}': expected sha256 ${entry.sha256} (${entry.byte_length} bytes), got ${actual} (${actualBytes} bytes)`,
    { tensor: entry.name, expected: entry.sha256, actual, expectedBytes: entry.byte_length, actualBytes },
  );
}

/** Async twin of manifest.ts `verifyTensor`, for browsers: throws TENSOR_HASH_MISMATCH. */
export async function verifyTensorBytes(manifest: Manifest, name: string, bytes: Uint8Array): Promise<void> {
  const entry = entryOf(manifest, name);
  const actual = await sha256HexAsync(bytes);
  if (actual !== entry.sha256 || bytes.length !== entry.byte_length) throw mismatch(entry, actual, bytes.length);
}

export interface VerifiedRead {
  /** verified bytes, keyed by tensor name */
  tensors: Map<string, Uint8Array>;
  /** tensors whose first read mismatched and whose re-fetch verified */
  refetched: string[];
}

export interface ReadVerifiedOptions {
  /** hash function (default SubtleCrypto; Node callers may pass manifest.ts sha256Hex) */
  hash?: (bytes: Uint8Array) => string | Promise<string>;
  /** told about every mismatch, including the one that is then re-fetched */
  onMismatch?: (err: MeshError) => void;
  /**
   * 'artifact': the one source reads the artifact's bytes, a split's files concatenated (e.g.
   * over `openArtifactReader`), so tensors are read at `artifactOffset`. Default 'file': one
   * source per file, tensors read at their offset within it.
   */
  addressing?: 'file' | 'artifact';
}

/**
 * Reads tensors (by name) from a source (or one source per file of a split artifact, indexed
 * like `manifest.artifact.files`) and verifies each against the manifest. Byte ranges come from
 * the manifest, not from the source's header. A mismatch is re-fetched once; a second mismatch
 * throws TENSOR_HASH_MISMATCH (the first such tensor; `details.tensors` lists all).
 */
export async function readVerifiedTensors(
  sources: TensorSource | readonly TensorSource[],
  manifest: Manifest,
  names: readonly string[],
  opts: ReadVerifiedOptions = {},
): Promise<VerifiedRead> {
  const hash = opts.hash ?? sha256HexAsync;
  const perFile = Array.isArray(sources) ? (sources as readonly TensorSource[]) : [sources as TensorSource];
  const entries = names.map((n) => entryOf(manifest, n));

  const readAll = async (list: ManifestTensor[]): Promise<Map<string, Uint8Array>> => {
    if (opts.addressing === 'artifact') {
      if (perFile.length !== 1) throw new MeshError('BAD_SHARD', `artifact addressing reads through one source, ${perFile.length} were given`);
      return perFile[0]!.read(list.map((e) => ({ ...tensorInfoOf(e), offset: artifactOffset(manifest, e) })));
    }
    const out = new Map<string, Uint8Array>();
    for (let f = 0; f < perFile.length; f++) {
      const mine = list.filter((e) => e.file === f);
      if (!mine.length) continue;
      for (const [k, v] of await perFile[f]!.read(mine.map(tensorInfoOf))) out.set(k, v);
    }
    const missing = list.find((e) => e.file >= perFile.length);
    if (missing) throw new MeshError('BAD_SHARD', `tensor '${missing.name}' is in file ${missing.file}, but only ${perFile.length} source(s) were given`);
    return out;
  };
  const check = async (list: ManifestTensor[], bytes: Map<string, Uint8Array>): Promise<MeshError[]> => {
    const bad: MeshError[] = [];
    for (const e of list) {
      const b = bytes.get(e.name)!;
      const actual = await hash(b);
      if (actual !== e.sha256 || b.length !== e.byte_length) {
        const err = mismatch(e, actual, b.length);
        opts.onMismatch?.(err);
        bad.push(err);
      }
    }
    return bad;
  };

  const tensors = await readAll(entries);
  const firstBad = await check(entries, tensors);
  if (!firstBad.length) return { tensors, refetched: [] };

  const retry = entries.filter((e) => firstBad.some((err) => err.details?.tensor === e.name));
  for (const e of retry) tensors.delete(e.name); // drop the bad bytes before fetching again
  const again = await readAll(retry);
  const stillBad = await check(retry, again);
  if (stillBad.length) {
    const first = stillBad[0]!;
    throw new MeshError('TENSOR_HASH_MISMATCH', first.message, {
      ...first.details,
      tensors: stillBad.map((e) => e.details?.tensor),
    });
  }
  for (const [k, v] of again) tensors.set(k, v);
  return { tensors, refetched: retry.map((e) => e.name) };
}
