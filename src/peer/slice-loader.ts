// Loading one shard's slice of an artifact: the units the cache holds (re-verified), then what
// other peers send (shard-exchange.ts; each tensor verified on arrival, a bad or missing one
// left to the server), then the rest by HTTP Range from the model URL — only those tensors' bytes, nearby ranges coalesced,
// in batches so progress can be reported — each tensor hashed against the manifest before it
// is kept (a mismatch is re-fetched once, then refused naming the tensor and both hashes).
// Newly fetched units are stored in the cache; a full cache is reported, not fatal.
// A split GGUF is read as its parts concatenated (the parts' URLs follow from the first's
// name): ranges are in artifact addressing, like the joined header the server describes.

import { MeshError } from '../errors.ts';
import type { Manifest, ManifestTensor } from '../gguf/verify.ts';
import { openArtifactReader } from '../gguf/source.ts';
import type { ByteReader } from '../gguf/source.ts';
import { artifactFiles } from '../gguf/split.ts';
import type { GgufHeader, TensorInfo, TensorSource } from '../gguf/types.ts';
import { artifactOffset, readVerifiedTensors, shardGroupNames, verifyTensorBytes } from '../gguf/verify.ts';
import type { ShardRange } from '../gguf/types.ts';
import type { ShardCache } from '../storage/shard-cache.ts';
import { unitTensorNames } from '../storage/shard-cache.ts';

export interface SliceProgress {
  /** bytes of the slice ready (from the cache or fetched and verified) */
  doneBytes: number;
  totalBytes: number;
  fetchedBytes: number;
  cachedBytes: number;
}

export interface LoadSliceOptions {
  manifest: Manifest;
  /** the artifact's URL (a split's first part: the others are named after it) */
  modelUrl: string;
  shard: ShardRange;
  /** headers for the model URL (the room secret, the peer id for the server's fetch log) */
  headers?: Record<string, string>;
  cache?: ShardCache | null;
  onProgress?: (p: SliceProgress) => void;
  /** told about every hash mismatch, including one that a re-fetch then fixes */
  onMismatch?: (e: MeshError) => void;
  /** told when the cache cannot be read or written (quota); loading goes on without it */
  onCacheError?: (e: MeshError) => void;
  /** bytes per fetch batch (default 8 MiB): one progress report per batch */
  batchBytes?: number;
  /** other peers holding the shard verified: asked, in order, before the model URL */
  peers?: PeerTensorSource[];
}

/** A peer that may send tensors (unverified: the loader checks each against the manifest). */
export interface PeerTensorSource {
  peerId: string;
  fetch(names: readonly string[]): Promise<Map<string, Uint8Array>>;
}

export interface LoadedSlice {
  /** verified bytes by tensor name */
  tensors: Map<string, Uint8Array>;
  units: string[];
  cachedUnits: string[];
  fetchedUnits: string[];
  totalBytes: number;
  /** bytes received over HTTP (gaps between coalesced ranges included) */
  fetchedBytes: number;
  /** verified bytes other peers sent, by peer id */
  peerBytes: Record<string, number>;
  requests: number;
  cachedBytes: number;
  /** tensors whose first read mismatched and whose re-fetch verified */
  refetched: string[];
  /** set when the cache refused (e.g. STORAGE_QUOTA); the slice is complete regardless */
  cacheError: MeshError | null;
  ms: number;
}

/** Splits entries (sorted by offset) into batches of about `limit` bytes. */
function batches(entries: ManifestTensor[], limit: number): ManifestTensor[][] {
  const out: ManifestTensor[][] = [];
  let cur: ManifestTensor[] = [];
  let bytes = 0;
  for (const e of entries) {
    if (cur.length && bytes + e.byte_length > limit) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(e);
    bytes += e.byte_length;
  }
  if (cur.length) out.push(cur);
  return out;
}

/** A TensorSource over the artifact's byte reader, with artifact byte ranges from the manifest (readVerifiedTensors reads through it). */
function rangeSource(reader: ByteReader): TensorSource {
  return {
    get header(): GgufHeader {
      throw new MeshError('INTERNAL', 'the range source has no header');
    },
    location: reader.location,
    async read(infos: readonly TensorInfo[]) {
      const parts = await reader.readRanges(
        infos.map((t) => ({ offset: t.offset, length: t.byteLength })),
        infos.map((t) => t.name),
      );
      return new Map(infos.map((t, i) => [t.name, parts[i]!]));
    },
    close: () => reader.close(),
  };
}

export async function loadSlice(opts: LoadSliceOptions): Promise<LoadedSlice> {
  const t0 = performance.now();
  const { manifest, shard } = opts;
  const files = artifactFiles(opts.modelUrl);
  if (files.length !== manifest.artifact.files.length) {
    throw new MeshError('GGUF_BAD_SPLIT', `${opts.modelUrl} names ${files.length} file(s), artifact ${manifest.artifact.sha256} has ${manifest.artifact.files.length}`);
  }
  const units = shardGroupNames(manifest, shard.start, shard.end);
  const wanted = new Set(units.flatMap((u) => unitTensorNames(manifest, u)));
  // in artifact order, so a batch's ranges are close together even across a split's parts
  const entries = manifest.tensors.filter((t) => wanted.has(t.name)).sort((a, b) => artifactOffset(manifest, a) - artifactOffset(manifest, b));
  const totalBytes = entries.reduce((s, e) => s + e.byte_length, 0);
  const tensors = new Map<string, Uint8Array>();
  let cacheError: MeshError | null = null;
  const cacheFailed = (e: unknown): void => {
    const err = e instanceof MeshError ? e : new MeshError('STORAGE_FAILED', String(e));
    cacheError ??= err;
    opts.onCacheError?.(err);
  };

  // 1. what the cache holds, re-verified
  let cachedUnits: string[] = [];
  let cachedBytes = 0;
  if (opts.cache) {
    try {
      const { result, hit } = await opts.cache.readUnits(manifest, units);
      cachedUnits = hit;
      for (const [k, v] of result.tensors) tensors.set(k, v);
      cachedBytes = [...tensors.values()].reduce((s, b) => s + b.byteLength, 0);
    } catch (e) {
      cacheFailed(e);
    }
  }
  const progress = (fetchedBytes: number): void => {
    const doneBytes = entries.reduce((s, e) => s + (tensors.has(e.name) ? e.byte_length : 0), 0);
    opts.onProgress?.({ doneBytes, totalBytes, fetchedBytes, cachedBytes });
  };
  progress(0);

  // 2. from peers that hold the shard, each tensor verified as it arrives
  const fetchedUnits = units.filter((u) => !cachedUnits.includes(u));
  const peerBytes = await fromPeers(opts, entries, tensors, () => progress(0));
  const storeComplete = async (stored: Set<string>): Promise<void> => {
    if (!opts.cache || cacheError) return;
    for (const u of fetchedUnits) {
      if (stored.has(u) || !unitTensorNames(manifest, u).every((n) => tensors.has(n))) continue;
      stored.add(u);
      try {
        await opts.cache.storeUnit(manifest, u, tensors);
      } catch (e) {
        cacheFailed(e);
        break;
      }
    }
  };
  const stored = new Set<string>();
  if (Object.keys(peerBytes).length) await storeComplete(stored);

  // 3. the rest over HTTP Range, verified batch by batch
  const missing = entries.filter((e) => !tensors.has(e.name));
  const refetched: string[] = [];
  let fetchedBytes = 0;
  let requests = 0;
  if (missing.length) {
    const reader = await openArtifactReader(
      files,
      manifest.artifact.files.map((f) => f.size),
      { ...(opts.headers ? { headers: opts.headers } : {}) },
    );
    const source = rangeSource(reader);
    try {
      for (const batch of batches(missing, opts.batchBytes ?? 8 * 1024 * 1024)) {
        const got = await readVerifiedTensors(source, manifest, batch.map((e) => e.name), { addressing: 'artifact', ...(opts.onMismatch ? { onMismatch: opts.onMismatch } : {}) });
        for (const [k, v] of got.tensors) tensors.set(k, v);
        refetched.push(...got.refetched);
        fetchedBytes = reader.stats.bytesRead;
        requests = reader.stats.requests;
        progress(fetchedBytes);
        // 4. store every unit that is now complete
        await storeComplete(stored);
      }
    } finally {
      await reader.close();
    }
  }
  return { tensors, units, cachedUnits, fetchedUnits, totalBytes, fetchedBytes, peerBytes, requests, cachedBytes, refetched, cacheError, ms: performance.now() - t0 };
}

/** Asks each peer in turn for the tensors still missing; keeps only those that verify. Verified bytes per peer. */
async function fromPeers(opts: LoadSliceOptions, entries: readonly ManifestTensor[], tensors: Map<string, Uint8Array>, progressed: () => void): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const peer of opts.peers ?? []) {
    const missing = entries.filter((e) => !tensors.has(e.name)).map((e) => e.name);
    if (!missing.length) break;
    let got: Map<string, Uint8Array>;
    try {
      got = await peer.fetch(missing);
    } catch {
      continue; // no channel, or it closed: the next peer, then the server
    }
    for (const [name, bytes] of got) {
      if (!missing.includes(name)) continue;
      try {
        await verifyTensorBytes(opts.manifest, name, bytes);
      } catch (e) {
        if (e instanceof MeshError) opts.onMismatch?.(e);
        continue;
      }
      tensors.set(name, bytes);
      out[peer.peerId] = (out[peer.peerId] ?? 0) + bytes.byteLength;
    }
    progressed();
  }
  return out;
}

/**
 * The TensorSource a backend loads from: the header the server described, and the slice's
 * verified bytes. Reading a tensor outside the slice is an error, never a silent fetch.
 * The header's byte ranges (artifact addressing, a split's joined header) must agree with the
 * manifest's (BAD_HEADER otherwise).
 */
export function sliceSource(header: GgufHeader, manifest: Manifest, slice: ReadonlyMap<string, Uint8Array>, location: string): TensorSource {
  for (const t of header.tensors) {
    const m = manifest.tensors.find((x) => x.name === t.name);
    if (!m || artifactOffset(manifest, m) !== t.offset || m.byte_length !== t.byteLength || m.type_id !== t.type) {
      throw new MeshError('BAD_HEADER', `the header's tensor '${t.name}' does not match the manifest of artifact ${manifest.artifact.sha256}`);
    }
  }
  return {
    header,
    location,
    async read(infos) {
      const out = new Map<string, Uint8Array>();
      for (const t of infos) {
        const b = slice.get(t.name);
        if (!b) throw new MeshError('TENSOR_NOT_IN_SLICE', `tensor '${t.name}' is not in this peer's verified slice`);
        out.set(t.name, b);
      }
      return out;
    },
    close: async () => undefined,
  };
}
