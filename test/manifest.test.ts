// Manifests (issue 8): whole-artifact and per-tensor sha256, shard groups, determinism,
// split artifacts, and verification with one re-fetch.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildManifest, manifestJson, verifyTensor } from '../src/gguf/manifest.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import { artifactOffset, parseManifest, readVerifiedTensors, shardGroupNames, shardTensors, verifyTensorBytes } from '../src/gguf/verify.ts';
import { openArtifactReader, openByteReader, openTensorSource, tensorSourceOver } from '../src/gguf/source.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { tensorGroups } from '../src/gguf/summary.ts';
import { writeGguf } from '../src/gguf/writer.ts';
import { GgmlType } from '../src/gguf/types.ts';
import type { GgufHeader } from '../src/gguf/types.ts';
import { isMeshError, MeshError } from '../src/errors.ts';
import { runCli } from './support/cli.ts';
import { stories260K } from './support/models.ts';
import { startRangeServer } from './support/range-server.ts';
import type { RangeServer } from './support/range-server.ts';

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

let model: string;
let original: Uint8Array;
let manifest: Manifest;
let dir: string;
let server: RangeServer;

beforeAll(async () => {
  model = await stories260K();
  original = new Uint8Array(readFileSync(model));
  manifest = await buildManifest(model);
  dir = mkdtempSync(join(tmpdir(), 'manifest-'));
  server = await startRangeServer();
  server.set('/stories260K.gguf', original);
});
afterAll(async () => {
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('manifest of stories260K', () => {
  it('artifact sha256 equals sha256sum of the file', () => {
    const sum = execFileSync('sha256sum', [model], { encoding: 'utf8' }).split(/\s+/)[0];
    expect(manifest.artifact.sha256).toBe(sum);
    expect(manifest.artifact.size).toBe(original.length);
    expect(manifest.artifact.files).toEqual([{ size: original.length, sha256: sum }]);
    expect(manifest.schema_version).toBe(1);
    expect(manifest.architecture).toBe('llama');
    expect(manifest.hyper_parameters).toMatchObject({ n_layer: 5, n_embd: 64, n_head: 8, n_head_kv: 4, n_vocab: 512 });
  });

  it('one entry per tensor, each with the sha256 of its bytes', async () => {
    const header = await readHeader(model);
    expect(manifest.tensors.map((t) => t.name)).toEqual(header.tensors.map((t) => t.name));
    expect(new Set(manifest.tensors.map((t) => t.name)).size).toBe(48);
    for (const t of manifest.tensors) {
      expect(t.sha256).toBe(sha(original.subarray(t.offset, t.offset + t.byte_length)));
      expect(t.type).toBe('F32');
    }
  });

  it('groups partition the tensors and their byte totals add up to the tensor data size', async () => {
    const header = await readHeader(model);
    expect(manifest.groups.map((g) => g.name)).toEqual(['embed', 'layer.0', 'layer.1', 'layer.2', 'layer.3', 'layer.4', 'head']);
    const all = manifest.groups.flatMap((g) => g.tensors);
    expect(all.sort()).toEqual(manifest.tensors.map((t) => t.name).sort());
    const total = manifest.groups.reduce((a, g) => a + g.bytes, 0);
    expect(total).toBe(manifest.tensor_data_bytes);
    // stories260K's tensors are all multiples of 32 bytes: no padding between them
    expect(total).toBe(header.fileBytes - header.tensorDataOffset);
    expect(manifest.groups.find((g) => g.name === 'layer.2')!.tensors).toHaveLength(9);
    expect(manifest.groups.find((g) => g.name === 'head')!.tensors).toEqual(['output_norm.weight', 'output.weight']);
  });

  it('is deterministic byte for byte: CLI twice, and over HTTP', async () => {
    const a = join(dir, 'a.json');
    const b = join(dir, 'b.json');
    const [ra, rb] = await Promise.all([runCli(['manifest', model, '--out', a]), runCli(['manifest', model, '--out', b])]);
    expect(ra.code, ra.stderr).toBe(0);
    expect(rb.code, rb.stderr).toBe(0);
    expect(ra.stdout).toContain(manifest.artifact.sha256);
    const ta = readFileSync(a);
    expect(Buffer.compare(ta, readFileSync(b))).toBe(0);
    expect(ta.toString('utf8')).toBe(manifestJson(manifest));
    // a URL is hashed by streaming it once: one plain GET besides the header's Range reads
    const before = server.requests.length;
    const remote = await buildManifest(`${server.url}/stories260K.gguf`);
    expect(manifestJson(remote)).toBe(manifestJson(manifest));
    const gets = server.requests.slice(before).filter((r) => r.range === undefined);
    expect(gets).toHaveLength(1);
    // --json prints the same text
    const rj = await runCli(['manifest', model, '--json']);
    expect(rj.stdout).toBe(manifestJson(manifest));
    expect(parseManifest(rj.stdout)).toEqual(manifest);
  });

  it('manifest errors name the problem (not a GGUF, missing file)', async () => {
    const p = join(dir, 'x.gguf');
    writeFileSync(p, 'definitely not a gguf file, just text');
    const r = await runCli(['manifest', p]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('GGUF_NOT_GGUF');
    expect(() => parseManifest('{"schema_version": 99}')).toThrow(MeshError);
  });
});

describe('verification', () => {
  it('verifyTensor / verifyTensorBytes accept good bytes and name the tensor and both hashes on a mismatch', async () => {
    const entry = manifest.tensors.find((t) => t.name === 'blk.2.attn_q.weight')!;
    const good = original.slice(entry.offset, entry.offset + entry.byte_length);
    verifyTensor(manifest, entry.name, good);
    await verifyTensorBytes(manifest, entry.name, good);
    const bad = good.slice();
    bad[100]! ^= 1;
    const badSha = sha(bad);
    for (const err of [
      (() => { try { verifyTensor(manifest, entry.name, bad); } catch (e) { return e; } })(),
      await verifyTensorBytes(manifest, entry.name, bad).catch((e: unknown) => e),
    ]) {
      expect(isMeshError(err, 'TENSOR_HASH_MISMATCH')).toBe(true);
      const m = (err as Error).message;
      expect(m).toContain('blk.2.attn_q.weight');
      expect(m).toContain(entry.sha256);
      expect(m).toContain(badSha);
    }
    // a short buffer is a mismatch too
    expect(() => verifyTensor(manifest, entry.name, good.subarray(1))).toThrow(/blk\.2\.attn_q\.weight/);
    expect(() => verifyTensor(manifest, 'nope', good)).toThrow(MeshError);
  });

  it('shardTensors picks embed / layers / head by range', () => {
    expect(shardGroupNames(manifest, 0, 2)).toEqual(['embed', 'layer.0', 'layer.1']);
    expect(shardGroupNames(manifest, 2, 5)).toEqual(['layer.2', 'layer.3', 'layer.4', 'head']);
    expect(shardTensors(manifest, 0, 5)).toHaveLength(48);
    expect(shardTensors(manifest, 1, 2).map((t) => t.name).every((n) => n.startsWith('blk.1.'))).toBe(true);
    expect(() => shardGroupNames(manifest, 3, 9)).toThrow(MeshError);
  });

  it('readVerifiedTensors: a flipped byte in blk.2 is re-fetched once, then refused naming the tensor', async () => {
    const flipped = original.slice();
    const victim = manifest.tensors.find((t) => t.name === 'blk.2.ffn_down.weight')!;
    flipped[victim.offset + 17]! ^= 0x80;
    server.set('/flipped.gguf', flipped);
    const url = `${server.url}/flipped.gguf`;
    const src = await openTensorSource(url);
    try {
      // other layers serve
      const l1 = await readVerifiedTensors(src, manifest, shardTensors(manifest, 1, 2).map((t) => t.name));
      expect(l1.tensors.size).toBe(9);
      expect(l1.refetched).toEqual([]);
      // layer 2 stays bad after the re-fetch
      const mismatches: string[] = [];
      const before = server.requests.length;
      const err = await readVerifiedTensors(src, manifest, shardTensors(manifest, 2, 3).map((t) => t.name), {
        onMismatch: (e) => mismatches.push(String(e.details?.tensor)),
      }).catch((e: unknown) => e);
      expect(isMeshError(err, 'TENSOR_HASH_MISMATCH')).toBe(true);
      expect((err as MeshError).message).toContain('blk.2.ffn_down.weight');
      expect((err as MeshError).details?.tensors).toEqual(['blk.2.ffn_down.weight']);
      expect(mismatches).toEqual(['blk.2.ffn_down.weight', 'blk.2.ffn_down.weight']);
      expect(server.requests.length - before).toBe(2); // the layer once, then the victim alone

      // a server that sent a bad copy once and then the right bytes: the re-fetch recovers
      const healed = await readVerifiedTensors(src, manifest, shardTensors(manifest, 2, 3).map((t) => t.name), {
        onMismatch: () => server.set('/flipped.gguf', original),
      });
      expect(healed.refetched).toEqual(['blk.2.ffn_down.weight']);
      expect(sha(healed.tensors.get('blk.2.ffn_down.weight')!)).toBe(victim.sha256);
    } finally {
      await src.close();
    }
  });

  it('a truncated file is caught the same way', async () => {
    const cut = original.slice(0, original.length - 300); // ends inside blk.4.ffn_up.weight
    const p = join(dir, 'cut.gguf');
    writeFileSync(p, cut);
    const src = await openTensorSource(p, { allowTruncatedData: true });
    try {
      const err = await readVerifiedTensors(src, manifest, ['blk.4.ffn_up.weight']).catch((e: unknown) => e);
      expect(isMeshError(err, 'SHORT_READ')).toBe(true);
      expect((err as Error).message).toContain('blk.4.ffn_up.weight');
    } finally {
      await src.close();
    }
  });
});

describe('split artifacts and tied heads', () => {
  it('a split GGUF is one artifact: sha256 of the parts in order, tensors hashed where they live', async () => {
    const header = await readHeader(model);
    const bytesOf = (name: string) => {
      const t = header.tensors.find((x) => x.name === name)!;
      return original.slice(t.offset, t.offset + t.byteLength);
    };
    const md = (no: number) => [
      { key: 'general.architecture', type: 'string' as const, value: 'llama' },
      { key: 'llama.block_count', type: 'uint32' as const, value: 5 },
      { key: 'llama.embedding_length', type: 'uint32' as const, value: 64 },
      { key: 'llama.attention.head_count', type: 'uint32' as const, value: 8 },
      { key: 'split.no', type: 'uint16' as const, value: no },
      { key: 'split.count', type: 'uint16' as const, value: 2 },
      { key: 'split.tensors.count', type: 'int32' as const, value: 48 },
    ];
    const spec = (names: string[]) => names.map((n) => {
      const t = header.tensors.find((x) => x.name === n)!;
      return { name: n, type: t.type, shape: t.shape, data: bytesOf(n) };
    });
    const names = header.tensors.map((t) => t.name);
    const firstNames = names.filter((n) => !/^blk\.[34]\./.test(n));
    const secondNames = names.filter((n) => /^blk\.[34]\./.test(n));
    const part1 = writeGguf({ metadata: md(0), tensors: spec(firstNames) });
    const part2 = writeGguf({ metadata: md(1), tensors: spec(secondNames) });
    writeFileSync(join(dir, 'tiny-00001-of-00002.gguf'), part1);
    writeFileSync(join(dir, 'tiny-00002-of-00002.gguf'), part2);
    server.set('/tiny-00001-of-00002.gguf', part1);
    server.set('/tiny-00002-of-00002.gguf', part2);

    const m = await buildManifest(join(dir, 'tiny-00002-of-00002.gguf')); // any part names the artifact
    expect(m.artifact.files.map((f) => f.size)).toEqual([part1.length, part2.length]);
    expect(m.artifact.sha256).toBe(sha(Buffer.concat([part1, part2])));
    expect(m.artifact.files[1]!.sha256).toBe(sha(part2));
    expect(m.artifact.size).toBe(part1.length + part2.length);
    expect(m.tensors).toHaveLength(48);
    for (const t of m.tensors) {
      expect(t.file).toBe(/^blk\.[34]\./.test(t.name) ? 1 : 0);
      expect(t.sha256).toBe(manifest.tensors.find((x) => x.name === t.name)!.sha256);
    }
    expect(m.groups.map((g) => [g.name, g.bytes])).toEqual(manifest.groups.map((g) => [g.name, g.bytes]));
    const remote = await buildManifest(`${server.url}/tiny-00001-of-00002.gguf`);
    expect(manifestJson(remote)).toBe(manifestJson(m));

    // reading a verified shard of a split: one source per file (byte ranges from the manifest)
    const parts = [join(dir, 'tiny-00001-of-00002.gguf'), join(dir, 'tiny-00002-of-00002.gguf')];
    const srcs = await Promise.all(parts.map(async (p) => tensorSourceOver(await readHeader(p), await openByteReader(p))));
    try {
      const got = await readVerifiedTensors(srcs, m, shardTensors(m, 2, 5).map((t) => t.name));
      expect(got.tensors.size).toBe(9 * 3 + 2);
    } finally {
      for (const s of srcs) await s.close();
    }
    // or through one reader of the parts concatenated (what a browser peer opens on the part URLs)
    const urls = [`${server.url}/tiny-00001-of-00002.gguf`, `${server.url}/tiny-00002-of-00002.gguf`];
    const reader = await openArtifactReader(urls, m.artifact.files.map((f) => f.size));
    const viaConcat = tensorSourceOver(await readHeader(urls[0]!), reader);
    try {
      const names = shardTensors(m, 2, 5).map((t) => t.name);
      const got = await readVerifiedTensors(viaConcat, m, names, { addressing: 'artifact' });
      expect([...got.tensors.keys()].sort()).toEqual([...names].sort());
      // without the option a single source is taken as file 0 only
      await expect(readVerifiedTensors(viaConcat, m, names)).rejects.toMatchObject({ code: 'BAD_SHARD' });
    } finally {
      await viaConcat.close();
    }
    // any part opens the whole artifact: the joined header addresses the parts concatenated
    const whole = await openTensorSource(parts[1]!);
    try {
      expect(whole.header.fileBytes).toBe(part1.length + part2.length);
      const all = await whole.read(whole.header.tensors);
      for (const t of m.tensors) {
        expect(whole.header.tensors.find((x) => x.name === t.name)!.offset).toBe(artifactOffset(m, t));
        expect(sha(all.get(t.name)!)).toBe(t.sha256);
      }
    } finally {
      await whole.close();
    }
  });

  it('a model without output.weight has a head that uses the tied token_embd.weight', () => {
    const t = (name: string, offset: number, byteLength: number) => ({ name, type: GgmlType.F32, shape: [byteLength / 4], nElements: byteLength / 4, offset, byteLength });
    const header: GgufHeader = {
      version: 3, metadata: {}, alignment: 32, tensorDataOffset: 64, fileBytes: 64 + 4 * 128,
      tensors: [t('token_embd.weight', 64, 128), t('blk.0.attn_norm.weight', 192, 128), t('output_norm.weight', 320, 128), t('rope_freqs.weight', 448, 128)],
    };
    const groups = tensorGroups(header, 1);
    expect(groups.map((g) => [g.name, g.tensors, g.uses, g.bytes])).toEqual([
      ['embed', ['token_embd.weight'], [], 128],
      ['layer.0', ['blk.0.attn_norm.weight'], [], 128],
      ['head', ['output_norm.weight'], ['token_embd.weight'], 128],
      ['global', ['rope_freqs.weight'], [], 128],
    ]);
  });
});

describe('loadOrBuildManifest', () => {
  it('computes once, caches beside the file, and rebuilds when the file changes', async () => {
    const { loadOrBuildManifest } = await import('../src/gguf/manifest.ts');
    const { utimesSync, existsSync } = await import('node:fs');
    const p = join(dir, 'cached.gguf');
    writeFileSync(p, original);
    const m1 = await loadOrBuildManifest(p);
    expect(existsSync(`${p}.manifest.json`)).toBe(true);
    expect(readFileSync(`${p}.manifest.json`, 'utf8')).toBe(manifestJson(manifest));
    expect(manifestJson(m1)).toBe(manifestJson(manifest));
    // a cached manifest is returned as is: prove it by planting a marker in the cache
    const planted = { ...m1, architecture: 'from-cache' };
    writeFileSync(`${p}.manifest.json`, manifestJson(planted));
    expect((await loadOrBuildManifest(p)).architecture).toBe('from-cache');
    // the file changes after the cache was written: rebuilt
    const changed = original.slice();
    changed[changed.length - 1]! ^= 1;
    writeFileSync(p, changed);
    const future = new Date(Date.now() + 5000);
    utimesSync(p, future, future);
    const m2 = await loadOrBuildManifest(p);
    expect(m2.architecture).toBe('llama');
    expect(m2.artifact.sha256).toBe(sha(changed));
  });
});
