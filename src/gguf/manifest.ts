// The manifest of a model artifact: architecture, hyper-parameters, every tensor's byte range,
// type and sha256, and the tensor groups (shard units) with their byte totals. Built by
// streaming the artifact once (local file or URL), hashing the whole and each tensor as the
// bytes pass. Deterministic: the same bytes give the same JSON byte for byte (no names,
// paths or times; fixed key order).
//
// A split GGUF (`name-00001-of-00003.gguf` …) is one artifact of several files: its sha256 is
// that of the files' bytes concatenated in order, and each tensor records which file holds it.
//
// Node-only (node:crypto for incremental hashing). The manifest's types and schema live in
// ./verify.ts, which browsers use for checking bytes.

import { createHash } from 'node:crypto';
import { MeshError } from '../errors.ts';
import { isUrl, readHeader } from './parse.ts';
import type { ReadHeaderOptions } from './parse.ts';
import { openByteReader } from './source.ts';
import { artifactFiles, readArtifactHeader } from './split.ts';
import { hyperParameters, tensorGroups } from './summary.ts';
import { ggmlTypeName } from './traits.ts';
import type { GgufHeader } from './types.ts';
import { MANIFEST_SCHEMA_VERSION, parseManifest } from './verify.ts';
import type { Manifest, ManifestFile, ManifestTensor } from './verify.ts';


export { artifactFiles };

/** Hashes one file front to back in one pass: the whole, and each tensor range as it passes. */
async function hashFile(
  location: string,
  header: GgufHeader,
  artifactHash: ReturnType<typeof createHash>,
  opts: ReadHeaderOptions,
): Promise<{ size: number; sha256: string; tensorHashes: Map<string, string> }> {
  const fileHash = createHash('sha256');
  const tensors = [...header.tensors].sort((a, b) => a.offset - b.offset);
  const hashes = tensors.map(() => createHash('sha256'));
  const seen = tensors.map(() => 0); // bytes fed per tensor
  let first = 0; // first tensor not yet complete
  let pos = 0;
  const reader = await openByteReader(location, opts);
  try {
    for await (const chunk of reader.stream()) {
      artifactHash.update(chunk);
      fileHash.update(chunk);
      const end = pos + chunk.length;
      while (first < tensors.length && tensors[first]!.offset + tensors[first]!.byteLength <= pos) first++;
      for (let k = first; k < tensors.length && tensors[k]!.offset < end; k++) {
        const t = tensors[k]!;
        const from = Math.max(t.offset, pos);
        const to = Math.min(t.offset + t.byteLength, end);
        if (to > from) {
          hashes[k]!.update(chunk.subarray(from - pos, to - pos));
          seen[k]! += to - from;
        }
      }
      pos = end;
    }
  } finally {
    await reader.close();
  }
  if (pos !== header.fileBytes) {
    throw new MeshError('SHORT_READ', `${location}: streamed ${pos} bytes, the header said the file has ${header.fileBytes}`);
  }
  const tensorHashes = new Map<string, string>();
  tensors.forEach((t, k) => {
    if (seen[k] !== t.byteLength) {
      throw new MeshError('SHORT_READ', `${location}: tensor '${t.name}' got ${seen[k]} of ${t.byteLength} bytes`);
    }
    tensorHashes.set(t.name, hashes[k]!.digest('hex'));
  });
  return { size: pos, sha256: fileHash.digest('hex'), tensorHashes };
}

/** Builds the manifest of the artifact at `location` (a file or URL; a split's any part). */
export async function buildManifest(location: string, opts: ReadHeaderOptions = {}): Promise<Manifest> {
  // every part's header, checked to be one split (split.no / split.count / split.tensors.count)
  const art = await readArtifactHeader(location, opts);
  const locations = art.files.map((f) => f.location);
  const headers = art.files.map((f) => f.header);

  const artifactHash = createHash('sha256');
  const files: ManifestFile[] = [];
  const tensors: ManifestTensor[] = [];
  const names = new Set<string>();
  for (let f = 0; f < locations.length; f++) {
    const header = headers[f]!;
    const { size, sha256, tensorHashes } = await hashFile(locations[f]!, header, artifactHash, opts);
    files.push({ size, sha256 });
    for (const t of header.tensors) {
      if (names.has(t.name)) throw new MeshError('GGUF_BAD_SPLIT', `tensor '${t.name}' appears in more than one file`);
      names.add(t.name);
      tensors.push({
        name: t.name,
        type: ggmlTypeName(t.type),
        type_id: t.type,
        shape: [...t.shape],
        file: f,
        offset: t.offset,
        byte_length: t.byteLength,
        sha256: tensorHashes.get(t.name)!,
      });
    }
  }

  // hyper-parameters live in the first file; groups span all files' tensors
  const all: GgufHeader = { ...headers[0]!, tensors: headers.flatMap((h) => h.tensors) };
  const hp = hyperParameters(all, location);
  return {
    schema_version: MANIFEST_SCHEMA_VERSION,
    artifact: { sha256: artifactHash.digest('hex'), size: files.reduce((a, f) => a + f.size, 0), files },
    architecture: hp.architecture,
    hyper_parameters: hp,
    tensor_data_bytes: tensors.reduce((a, t) => a + t.byte_length, 0),
    tensors,
    groups: tensorGroups(all, hp.n_layer),
  };
}

/** The canonical text of a manifest: 2-space JSON with a final newline. */
export function manifestJson(manifest: Manifest): string {
  return JSON.stringify(manifest, null, 2) + '\n';
}

/** sha256 of bytes, lower-case hex (node:crypto). */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/**
 * Checks one tensor's bytes against the manifest. Throws TENSOR_HASH_MISMATCH naming the
 * tensor and both hashes, or UNKNOWN_TENSOR when the manifest has no such tensor.
 */
export function verifyTensor(manifest: Manifest, name: string, bytes: Uint8Array): void {
  const entry = manifest.tensors.find((t) => t.name === name);
  if (!entry) throw new MeshError('UNKNOWN_TENSOR', `tensor '${name}' is not in the manifest of artifact ${manifest.artifact.sha256}`);
  const actual = sha256Hex(bytes);
  if (actual !== entry.sha256 || bytes.length !== entry.byte_length) {
    throw new MeshError(
      'TENSOR_HASH_MISMATCH',
      `tensor '${name}': expected sha256 ${entry.sha256} (${entry.byte_length} bytes), got ${actual} (${bytes.length} bytes)`,
      { tensor: name, expected: entry.sha256, actual, expectedBytes: entry.byte_length, actualBytes: bytes.length },
    );
  }
}

export interface CachedManifestOptions extends ReadHeaderOptions {
  /**
   * Where to keep the manifest: default `<file>.manifest.json` beside a local file; URLs are
   * cached only where a path is given. A cache that cannot be written is skipped silently.
   */
  cachePath?: string;
}

/**
 * The manifest of a local file or URL, computed once and cached: a cached manifest is used
 * while it is newer than every file of the artifact and records their sizes. (URLs: the cache
 * is trusted while the remote sizes match — pass no cachePath to always re-hash.)
 */
export async function loadOrBuildManifest(location: string, opts: CachedManifestOptions = {}): Promise<Manifest> {
  const { readFile, stat, writeFile, rename } = await import('node:fs/promises');
  const files = artifactFiles(location);
  const cachePath = opts.cachePath ?? (isUrl(location) ? undefined : `${files[0]}.manifest.json`);
  if (cachePath) {
    try {
      const cached = parseManifest(await readFile(cachePath, 'utf8'));
      const cacheTime = (await stat(cachePath)).mtimeMs;
      let fresh = cached.artifact.files.length === files.length;
      for (let i = 0; fresh && i < files.length; i++) {
        if (isUrl(files[i]!)) {
          fresh = (await readHeader(files[i]!, { ...opts, allowTruncatedData: true })).fileBytes === cached.artifact.files[i]!.size;
        } else {
          const s = await stat(files[i]!);
          fresh = s.size === cached.artifact.files[i]!.size && s.mtimeMs <= cacheTime;
        }
      }
      if (fresh) return cached;
    } catch {
      // no cache, or an unreadable one: build
    }
  }
  const manifest = await buildManifest(location, opts);
  if (cachePath) {
    try {
      const tmp = `${cachePath}.${process.pid}.tmp`;
      await writeFile(tmp, manifestJson(manifest));
      await rename(tmp, cachePath);
    } catch {
      // read-only place: serve without caching
    }
  }
  return manifest;
}
