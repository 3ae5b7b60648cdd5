// The shard cache on Chromium's real IndexedDB (idb-keyval): units survive a new cache
// instance (a reload), are re-verified on read, are keyed by artifact, a failing batch leaves
// nothing behind (IndexedDB's transaction is the half-write guard), and storage failures
// carry stable codes.
import { describe, expect, it } from 'vitest';
import type { Manifest } from '../../src/gguf/verify.ts';
import { sha256HexAsync } from '../../src/gguf/verify.ts';
import { indexedDbStore, storageError } from '../../src/storage/kv-store.ts';
import type { KeyValueStore } from '../../src/storage/kv-store.ts';
import { opfsStore } from '../../src/storage/opfs-store.ts';
import { ShardCache } from '../../src/storage/shard-cache.ts';
import type { CacheEvent } from '../../src/storage/shard-cache.ts';

function bytes(n: number, seed: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed * 7) & 0xff;
  return b;
}

/** A two-layer artifact's manifest over made-up tensor bytes. */
async function tinyManifest(sha: string): Promise<{ manifest: Manifest; data: Map<string, Uint8Array> }> {
  const data = new Map<string, Uint8Array>([
    ['token_embd.weight', bytes(4096, 1)],
    ['blk.0.attn_q.weight', bytes(1024, 2)],
    ['blk.1.attn_q.weight', bytes(1024, 3)],
    ['output_norm.weight', bytes(256, 4)],
  ]);
  let offset = 4096;
  const tensors = [];
  for (const [name, b] of data) {
    tensors.push({ name, type: 'F32', type_id: 0, shape: [b.length / 4], file: 0, offset, byte_length: b.length, sha256: await sha256HexAsync(b) });
    offset += b.length;
  }
  const group = (name: string, t: string[], uses: string[] = []) => ({ name, tensors: t, uses, bytes: t.reduce((s, n) => s + data.get(n)!.length, 0) });
  const manifest = {
    schema_version: 1,
    artifact: { sha256: sha, size: offset, files: [{ size: offset, sha256: sha }] },
    architecture: 'llama',
    hyper_parameters: { n_layer: 2 },
    tensor_data_bytes: offset - 4096,
    tensors,
    groups: [group('embed', ['token_embd.weight']), group('layer.0', ['blk.0.attn_q.weight']), group('layer.1', ['blk.1.attn_q.weight']), group('head', ['output_norm.weight'], ['token_embd.weight'])],
  } as unknown as Manifest;
  return { manifest, data };
}

const dbName = `gguf-mesh-test-${Math.random().toString(36).slice(2)}`;

const stores: Record<string, () => Promise<KeyValueStore>> = {
  indexeddb: async () => indexedDbStore(dbName),
  opfs: () => opfsStore(dbName),
};

describe.each(Object.keys(stores))('ShardCache over %s', (kind) => {
  it('keeps units across cache instances, re-verifies them, and keys them by artifact', async () => {
    const open = stores[kind]!;
    const { manifest, data } = await tinyManifest('a'.repeat(64));
    const writer = new ShardCache(await open());
    await writer.storeUnit(manifest, 'layer.0', data);
    await writer.storeUnit(manifest, 'head', data); // uses the tied embedding too

    const events: CacheEvent[] = [];
    const reader = new ShardCache(await open(), (e) => events.push(e)); // as after a reload
    expect(await reader.heldUnits(manifest.artifact.sha256)).toEqual(['head', 'layer.0']);
    const { result, hit, miss } = await reader.readUnits(manifest, ['embed', 'layer.0', 'layer.1', 'head']);
    expect(hit).toEqual(['layer.0', 'head']);
    expect(miss).toEqual(['embed', 'layer.1']);
    expect(result.tensors.get('token_embd.weight')).toEqual(data.get('token_embd.weight'));
    expect(result.bytes).toBe(1024 + 256 + 4096);

    const other = await tinyManifest('b'.repeat(64));
    expect(await reader.heldUnits(other.manifest.artifact.sha256)).toEqual([]);
    expect((await reader.readUnits(other.manifest, ['layer.0'])).hit).toEqual([]);

    // bytes edited on disk are caught by the re-hash and the unit is dropped
    const store = await open();
    const key = `t/${manifest.artifact.sha256}/blk.0.attn_q.weight`;
    const bad = data.get('blk.0.attn_q.weight')!.slice();
    bad[0]! ^= 1;
    await store.setMany([[key, bad]]);
    expect((await reader.readUnits(manifest, ['layer.0'])).miss).toEqual(['layer.0']);
    expect(events.at(-1)).toMatchObject({ kind: 'dropped', unit: 'layer.0' });
    expect(await reader.heldUnits(manifest.artifact.sha256)).toEqual(['head']);

    await reader.clear(manifest.artifact.sha256);
    expect(await reader.heldUnits(manifest.artifact.sha256)).toEqual([]);
  });
});

describe('half-written batches', () => {
  it('OPFS: a batch cut short before its commit record leaves no unit', async () => {
    const store = await opfsStore(dbName);
    const err = await store.setMany([
      ['t/c/blk.0.x', bytes(100, 5)],
      ['u/c/layer.0', { n: 1n }], // JSON cannot hold a bigint: the commit record never lands
    ]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TypeError);
    expect(await new ShardCache(store).heldUnits('c')).toEqual([]);
  });

  it('IndexedDB: writes a batch in one transaction: a failing entry leaves none of the batch behind', async () => {
    const store = indexedDbStore(dbName);
    const err = await store.setMany([
      ['t/x/first', bytes(100, 9)],
      ['u/x/unit', { fn: () => 1 }], // not structured-cloneable: the put throws DataCloneError
    ]).catch((e: unknown) => e);
    expect((err as DOMException).name).toBe('DataCloneError');
    expect(await store.getMany(['t/x/first', 'u/x/unit'])).toEqual([undefined, undefined]);
    expect(storageError(err, 'storing').code).toBe('STORAGE_FAILED');
    expect(storageError(new DOMException('full', 'QuotaExceededError'), 'storing').code).toBe('STORAGE_QUOTA');
  });
});
