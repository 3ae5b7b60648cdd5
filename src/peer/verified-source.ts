// A TensorSource that never hands out bytes it has not verified: every tensor is hashed and
// compared with the artifact's manifest. Verified tensors are kept in a cache directory keyed
// by the artifact's sha256 (one file per tensor), re-verified whenever they are read back, so
// two models never mix and a restarted peer loads its shard without fetching a byte.
//
//   <cacheDir>/<artifact sha256>/<tensor name>.bin
//
// A mismatch drops the bytes and fetches the tensor once more; a second mismatch is an error
// (TENSOR_HASH_MISMATCH) naming the tensor and both hashes.

import { mkdir, readFile, rename, unlink, writeFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { MeshError } from '../errors.ts';
// hashing off this thread (SubtleCrypto): a shard of gigabytes must not hold up the heartbeat
import { verifyTensorBytes } from '../gguf/verify.ts';
import type { Manifest } from '../gguf/verify.ts';
import type { GgufHeader, TensorInfo, TensorSource } from '../gguf/types.ts';

function fileOf(dir: string, name: string): string {
  return join(dir, `${name.replace(/[^A-Za-z0-9_.-]/g, '_')}.bin`);
}

export interface VerifiedSourceOptions {
  header: GgufHeader;
  manifest: Manifest;
  /** root of the shard cache; null = no cache */
  cacheDir: string | null;
  /** opens the network source on first need (a warm cache opens nothing) */
  openInner: () => Promise<TensorSource>;
  location: string;
  log?: (line: string) => void;
  /** called as tensors are verified: bytes of this read done so far, and in total */
  onProgress?: (bytesDone: number, bytesTotal: number) => void;
}

export class VerifiedSource implements TensorSource {
  readonly header: GgufHeader;
  readonly location: string;
  /** bytes fetched from the network (0 when every tensor came from the cache) */
  bytesFetched = 0;
  /** tensors served from the cache, after re-verification */
  cacheHits = 0;
  private inner: TensorSource | null = null;
  private readonly dir: string | null;

  constructor(private readonly opts: VerifiedSourceOptions) {
    this.header = opts.header;
    this.location = opts.location;
    this.dir = opts.cacheDir ? join(opts.cacheDir, opts.manifest.artifact.sha256) : null;
  }

  async read(tensors: readonly TensorInfo[]): Promise<Map<string, Uint8Array>> {
    const out = new Map<string, Uint8Array>();
    const missing: TensorInfo[] = [];
    const total = tensors.reduce((a, t) => a + t.byteLength, 0);
    let done = 0;
    const progress = (n: number): void => {
      done += n;
      this.opts.onProgress?.(done, total);
    };
    for (const t of tensors) {
      const cached = await this.fromCache(t.name);
      if (cached) {
        out.set(t.name, cached);
        progress(cached.byteLength);
      } else missing.push(t);
    }
    if (missing.length === 0) return out;
    const fetched = await this.fetch(missing);
    for (const t of missing) {
      let bytes = fetched.get(t.name)!;
      try {
        await verifyTensorBytes(this.opts.manifest, t.name, bytes);
      } catch (e) {
        if (!(e instanceof MeshError) || e.code !== 'TENSOR_HASH_MISMATCH') throw e;
        this.opts.log?.(`${e.message}; fetching it once more`);
        bytes = (await this.fetch([t])).get(t.name)!;
        await verifyTensorBytes(this.opts.manifest, t.name, bytes); // a second mismatch refuses the shard
      }
      out.set(t.name, bytes);
      await this.toCache(t.name, bytes);
      progress(bytes.byteLength);
    }
    return out;
  }

  async close(): Promise<void> {
    await this.inner?.close();
  }

  private async fetch(tensors: TensorInfo[]): Promise<Map<string, Uint8Array>> {
    this.inner ??= await this.opts.openInner();
    const got = await this.inner.read(tensors);
    for (const t of tensors) this.bytesFetched += got.get(t.name)?.byteLength ?? 0;
    return got;
  }

  private async fromCache(name: string): Promise<Uint8Array | null> {
    if (!this.dir) return null;
    let bytes: Uint8Array;
    try {
      bytes = new Uint8Array(await readFile(fileOf(this.dir, name)));
    } catch {
      return null;
    }
    try {
      await verifyTensorBytes(this.opts.manifest, name, bytes);
    } catch {
      this.opts.log?.(`cached tensor '${name}' failed verification; dropping it`);
      await unlink(fileOf(this.dir, name)).catch(() => undefined);
      return null;
    }
    this.cacheHits++;
    return bytes;
  }

  private async toCache(name: string, bytes: Uint8Array): Promise<void> {
    if (!this.dir) return;
    try {
      await mkdir(this.dir, { recursive: true });
      const tmp = `${fileOf(this.dir, name)}.${process.pid}.tmp`;
      await writeFile(tmp, bytes);
      await rename(tmp, fileOf(this.dir, name));
    } catch {
      // a cache that cannot be written only costs a later re-fetch
    }
  }
}

/**
 * Shard units (manifest groups) whose tensors are all present in the cache for this artifact.
 * Presence is enough to advertise; the bytes are re-verified when a stage loads them.
 */
export async function heldUnits(cacheDir: string, manifest: Manifest): Promise<string[]> {
  let names: Set<string>;
  try {
    names = new Set(await readdir(join(cacheDir, manifest.artifact.sha256)));
  } catch {
    return [];
  }
  return manifest.groups
    .filter((g) => g.tensors.length > 0 && [...g.tensors, ...g.uses].every((t) => names.has(`${t.replace(/[^A-Za-z0-9_.-]/g, '_')}.bin`)))
    .map((g) => g.name);
}

/** The contiguous layer range [start, end) that a set of units covers, if any. */
export function unitsRange(units: readonly string[]): { start: number; end: number } | null {
  const layers = units.map((u) => /^layer\.(\d+)$/.exec(u)).filter((m): m is RegExpExecArray => m !== null).map((m) => Number(m[1])).sort((a, b) => a - b);
  if (layers.length === 0) return null;
  for (let i = 1; i < layers.length; i++) if (layers[i] !== layers[i - 1]! + 1) return null;
  return { start: layers[0]!, end: layers.at(-1)! + 1 };
}
