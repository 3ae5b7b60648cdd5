// The browser peer's slice loading, run in Node over real HTTP (the same fetch and SubtleCrypto
// code paths browsers use): only the shard's byte ranges are fetched, every tensor is verified
// against the manifest, cached units are re-verified and reused, a full cache is reported
// without breaking the load, and a corrupted tensor is refused by name.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MeshError } from '../src/errors.ts';
import { buildManifest } from '../src/gguf/manifest.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { headerFromWire, headerToWire, MAX_WIRE_ARRAY } from '../src/protocol/header-wire.ts';
import { loadSlice, sliceSource } from '../src/peer/slice-loader.ts';
import type { SliceProgress } from '../src/peer/slice-loader.ts';
import { memoryStore } from '../src/storage/kv-store.ts';
import { ShardCache } from '../src/storage/shard-cache.ts';
import type { CacheEvent } from '../src/storage/shard-cache.ts';
import { startRangeServer } from './support/range-server.ts';
import type { RangeServer } from './support/range-server.ts';
import { stories260K } from './support/models.ts';

let server: RangeServer;
let manifest: Manifest;
let path: string;
let original: Uint8Array;

beforeAll(async () => {
  path = await stories260K();
  manifest = await buildManifest(path);
  original = new Uint8Array(readFileSync(path));
  server = await startRangeServer();
  server.set('/m.gguf', original);
  const bad = original.slice();
  const victim = manifest.tensors.find((t) => t.name === 'blk.2.ffn_up.weight')!;
  bad[victim.offset + 100]! ^= 0x01; // one flipped bit inside layer 2
  server.set('/bad.gguf', bad);
});
afterAll(() => server.close());

/** Byte equality without vitest's element-by-element deep equal (slow on 100 KB arrays). */
function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

const SHARDS = [
  { start: 0, end: 2 },
  { start: 2, end: 4 },
  { start: 4, end: 5 },
];

describe('loadSlice', () => {
  it('fetches only the shard tensors (≤ 1.02 × shard bytes), verified, with progress', async () => {
    for (const shard of SHARDS) {
      const progress: SliceProgress[] = [];
      const before = server.requests.length;
      const s = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard, onProgress: (p) => progress.push(p) });
      const expected = manifest.tensors.filter((t) => {
        const m = /^blk\.(\d+)\./.exec(t.name);
        if (m) return Number(m[1]) >= shard.start && Number(m[1]) < shard.end;
        return (shard.start === 0 && t.name === 'token_embd.weight') || (shard.end === 5 && t.name.startsWith('output'));
      });
      expect([...s.tensors.keys()].sort()).toEqual(expected.map((t) => t.name).sort());
      expect(s.totalBytes).toBe(expected.reduce((a, t) => a + t.byte_length, 0));
      expect(s.fetchedBytes).toBeGreaterThanOrEqual(s.totalBytes);
      expect(s.fetchedBytes).toBeLessThanOrEqual(1.02 * s.totalBytes);
      for (const t of expected) expect(sameBytes(s.tensors.get(t.name)!, original.subarray(t.offset, t.offset + t.byte_length))).toBe(true);
      // every request was a Range inside the shard's tensors, none touched the header
      const ranges = server.requests.slice(before).map((r) => r.range!);
      expect(ranges.length).toBe(s.requests);
      for (const r of ranges) expect(Number(/bytes=(\d+)-/.exec(r)![1])).toBeGreaterThanOrEqual(manifest.tensors.reduce((a, t) => Math.min(a, t.offset), Infinity));
      expect(progress.at(-1)).toMatchObject({ doneBytes: s.totalBytes, totalBytes: s.totalBytes, cachedBytes: 0 });
      for (let i = 1; i < progress.length; i++) expect(progress[i]!.doneBytes).toBeGreaterThanOrEqual(progress[i - 1]!.doneBytes);
    }
  });

  it('reports progress per batch when the slice spans several batches', async () => {
    const progress: SliceProgress[] = [];
    const s = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard: { start: 0, end: 5 }, batchBytes: 100_000, onProgress: (p) => progress.push(p) });
    expect(progress.length).toBeGreaterThan(5);
    expect(progress[0]!.doneBytes).toBe(0);
    expect(progress.at(-1)!.doneBytes).toBe(s.totalBytes);
  });

  it('stores fetched units and reuses them with zero bytes fetched, re-verifying each', async () => {
    const events: CacheEvent[] = [];
    const cache = new ShardCache(memoryStore(), (e) => events.push(e));
    const first = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard: { start: 2, end: 5 }, cache });
    expect(first.cachedUnits).toEqual([]);
    expect(await cache.heldUnits(manifest.artifact.sha256)).toEqual(['head', 'layer.2', 'layer.3', 'layer.4']);

    const before = server.requests.length;
    const second = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard: { start: 2, end: 5 }, cache });
    expect(server.requests.length).toBe(before);
    expect(second.fetchedBytes).toBe(0);
    expect(second.cachedBytes).toBe(second.totalBytes);
    expect(second.cachedUnits.sort()).toEqual(['head', 'layer.2', 'layer.3', 'layer.4']);
    for (const [k, v] of first.tensors) expect(sameBytes(second.tensors.get(k)!, v)).toBe(true);

    // rot one cached tensor: its unit is dropped and fetched again, the others stay cached
    const key = `t/${manifest.artifact.sha256}/blk.3.attn_q.weight`;
    const [stored] = (await cache.store.getMany([key])) as Uint8Array[];
    const rotten = stored!.slice();
    rotten[5]! ^= 0xff;
    await cache.store.setMany([[key, rotten]]);
    const third = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard: { start: 2, end: 5 }, cache });
    expect(third.fetchedUnits).toEqual(['layer.3']);
    expect(sameBytes(third.tensors.get('blk.3.attn_q.weight')!, first.tensors.get('blk.3.attn_q.weight')!)).toBe(true);
    expect(events.some((e) => e.kind === 'dropped' && e.unit === 'layer.3' && /sha256/.test(e.reason))).toBe(true);

    // a different artifact never sees these units
    expect(await cache.heldUnits('0'.repeat(64))).toEqual([]);
  });

  it('reports a full cache (STORAGE_QUOTA) and still returns the whole verified slice; no unit is half-stored', async () => {
    const cache = new ShardCache(memoryStore(150_000)); // room for layer.0 (~180 KB)? no: for nothing bigger than 150 KB
    const errors: MeshError[] = [];
    const s = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard: { start: 0, end: 2 }, cache, batchBytes: 50_000, onCacheError: (e) => errors.push(e) });
    expect(s.cacheError?.code).toBe('STORAGE_QUOTA');
    expect(errors.map((e) => e.code)).toEqual(['STORAGE_QUOTA']);
    expect(s.tensors.size).toBe(1 + 2 * 9);
    const held = await cache.heldUnits(manifest.artifact.sha256);
    // whatever was stored is complete and verifies; nothing of a refused unit is listed
    const again = await cache.readUnits(manifest, held);
    expect(again.hit).toEqual(held);
    expect(held).not.toContain('layer.1');
  });

  it('refuses a corrupted tensor by name after one re-fetch; other shards of the same file load', async () => {
    const mismatches: MeshError[] = [];
    const err = await loadSlice({ manifest, modelUrl: `${server.url}/bad.gguf`, shard: { start: 2, end: 4 }, onMismatch: (e) => mismatches.push(e) }).catch((e: unknown) => e);
    expect((err as MeshError).code).toBe('TENSOR_HASH_MISMATCH');
    expect((err as MeshError).details?.tensor).toBe('blk.2.ffn_up.weight');
    expect((err as MeshError).message).toContain(manifest.tensors.find((t) => t.name === 'blk.2.ffn_up.weight')!.sha256);
    expect(mismatches.length).toBe(2); // the first read and the re-fetch
    const ok = await loadSlice({ manifest, modelUrl: `${server.url}/bad.gguf`, shard: { start: 0, end: 2 } });
    expect(ok.tensors.size).toBe(19);
  });

  it('sliceSource serves only the slice, under a header that must match the manifest', async () => {
    const header = headerFromWire(JSON.parse(JSON.stringify(headerToWire(await readHeader(path)))));
    // big arrays (a real vocabulary's tokens and merges) stay on the server
    const raw = await readHeader(path);
    expect(headerToWire({ ...raw, metadata: { ...raw.metadata, 'tokenizer.ggml.merges': new Array(MAX_WIRE_ARRAY + 1).fill('a b') } }).metadata['tokenizer.ggml.merges']).toBeUndefined();
    expect(header.metadata['llama.block_count']).toBe(5);
    const s = await loadSlice({ manifest, modelUrl: `${server.url}/m.gguf`, shard: { start: 4, end: 5 } });
    const src = sliceSource(header, manifest, s.tensors, 'm.gguf');
    const info = header.tensors.find((t) => t.name === 'blk.4.ffn_up.weight')!;
    expect((await src.read([info])).get(info.name)!.byteLength).toBe(info.byteLength);
    const outside = header.tensors.find((t) => t.name === 'blk.0.ffn_up.weight')!;
    expect(((await src.read([outside]).catch((e: unknown) => e)) as MeshError).code).toBe('TENSOR_NOT_IN_SLICE');
    const lying = { ...header, tensors: header.tensors.map((t) => (t.name === info.name ? { ...t, offset: t.offset + 32 } : t)) };
    expect(() => sliceSource(lying, manifest, s.tensors, 'm.gguf')).toThrow(expect.objectContaining({ code: 'BAD_HEADER' }));
  });
});
