import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { coalesceRanges } from '../src/gguf/ranges.ts';
import { openArtifactReader, openTensorSource, readByteRanges, openByteReader } from '../src/gguf/source.ts';
import { isMeshError } from '../src/errors.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { stories260K } from './support/models.ts';
import { startRangeServer } from './support/range-server.ts';
import type { RangeServer } from './support/range-server.ts';

describe('coalesceRanges', () => {
  it('merges adjacent and near ranges, keeps far ones apart, and maps every part back', () => {
    const ranges = [
      { offset: 1000, length: 10 },
      { offset: 0, length: 100 },
      { offset: 100, length: 50 }, // adjacent to the previous
      { offset: 10_000_000, length: 5 }, // far away
      { offset: 20, length: 10 }, // inside the first
    ];
    const reads = coalesceRanges(ranges, { maxGap: 4096 });
    expect(reads.map((r) => [r.offset, r.length])).toEqual([[0, 1010], [10_000_000, 5]]);
    const covered = reads.flatMap((r) => r.parts.map((p) => ({ index: p.index, offset: r.offset + p.relOffset, length: p.length })));
    expect(covered.sort((a, b) => a.index - b.index)).toEqual(ranges.map((r, index) => ({ index, ...r })));
  });

  it('splits at maxLength and never merges past a gap larger than maxGap', () => {
    const ranges = Array.from({ length: 10 }, (_, i) => ({ offset: i * 100, length: 100 }));
    expect(coalesceRanges(ranges, { maxLength: 300 }).map((r) => r.length)).toEqual([300, 300, 300, 100]);
    expect(coalesceRanges([{ offset: 0, length: 1 }, { offset: 12, length: 1 }], { maxGap: 10 })).toHaveLength(2);
    expect(coalesceRanges([{ offset: 0, length: 1 }, { offset: 11, length: 1 }], { maxGap: 10 })).toHaveLength(1);
    expect(coalesceRanges([])).toEqual([]);
  });
});

describe('TensorSource', () => {
  let model: string;
  let original: Uint8Array;
  let server: RangeServer;
  let plain: RangeServer;
  let dir: string;

  beforeAll(async () => {
    model = await stories260K();
    original = new Uint8Array(readFileSync(model));
    server = await startRangeServer();
    plain = await startRangeServer({ ignoreRange: true });
    server.set('/m.gguf', original);
    plain.set('/m.gguf', original);
    dir = mkdtempSync(join(tmpdir(), 'gguf-source-'));
  });
  afterAll(async () => {
    await server.close();
    await plain.close();
    rmSync(dir, { recursive: true, force: true });
  });

  function expectedBytes(t: { offset: number; byteLength: number }): Uint8Array {
    return original.subarray(t.offset, t.offset + t.byteLength);
  }

  it('reads tensors from a local file', async () => {
    const src = await openTensorSource(model);
    try {
      const wanted = src.header.tensors.filter((t) => t.name.startsWith('blk.2.'));
      const got = await src.read(wanted);
      expect([...got.keys()]).toEqual(wanted.map((t) => t.name));
      for (const t of wanted) expect(Buffer.compare(got.get(t.name)!, expectedBytes(t))).toBe(0);
      expect(src.bytes.stats.requests).toBe(1); // one layer is contiguous: one read
    } finally {
      await src.close();
    }
  });

  it('reads one layer over HTTP in a single coalesced Range request', async () => {
    const src = await openTensorSource(`${server.url}/m.gguf`);
    try {
      const before = server.requests.length;
      const layer3 = src.header.tensors.filter((t) => t.name.startsWith('blk.3.'));
      const got = await src.read(layer3);
      expect(server.requests.length - before).toBe(1);
      expect(server.requests.at(-1)!.range).toMatch(/^bytes=\d+-\d+$/);
      for (const t of layer3) expect(Buffer.compare(got.get(t.name)!, expectedBytes(t))).toBe(0);

      // embedding + head + layers 0 and 4: far apart pieces; gaps below 64 KiB are read through
      const mixed = src.header.tensors.filter((t) => /^(token_embd|output|blk\.0\.|blk\.4\.)/.test(t.name));
      const n0 = server.requests.length;
      const got2 = await src.read(mixed);
      for (const t of mixed) expect(Buffer.compare(got2.get(t.name)!, expectedBytes(t))).toBe(0);
      expect(server.requests.length - n0).toBe(2); // [embd, output_norm, output, blk.0] and [blk.4]
      expect(src.bytes.stats.requests).toBe(3);
    } finally {
      await src.close();
    }
  });

  it('a server that ignores Range: RANGE_NOT_SUPPORTED', async () => {
    const r = await openByteReader(`${plain.url}/m.gguf`);
    const err = await r.readRanges([{ offset: 100, length: 10 }]).catch((e: unknown) => e);
    expect(isMeshError(err, 'RANGE_NOT_SUPPORTED')).toBe(true);
  });

  it('a short read names the tensor (file and URL)', async () => {
    const h = await readHeader(model);
    const cut = original.slice(0, original.length - 300); // cuts into blk.4.ffn_up.weight's tail
    const path = join(dir, 'cut.gguf');
    writeFileSync(path, cut);
    server.set('/cut.gguf', cut);
    const victim = h.tensors.find((t) => t.name === 'blk.4.ffn_up.weight')!;
    for (const loc of [path, `${server.url}/cut.gguf`]) {
      const src = await openTensorSource(loc, { allowTruncatedData: true });
      try {
        const err = await src.read([victim]).catch((e: unknown) => e);
        expect(isMeshError(err, 'SHORT_READ'), String(err)).toBe(true);
        expect((err as Error).message).toContain('blk.4.ffn_up.weight');
        // a tensor that lies wholly past the end
        const gone = h.tensors.find((t) => t.name === 'blk.4.ffn_norm.weight')!;
        const err2 = await src.read([gone]).catch((e: unknown) => e);
        expect(isMeshError(err2, 'SHORT_READ')).toBe(true);
        expect((err2 as Error).message).toContain('blk.4.ffn_norm.weight');
      } finally {
        await src.close();
      }
    }
  });

  it('readByteRanges reads arbitrary ranges, and stream() yields the whole file', async () => {
    const ranges = [{ offset: 0, length: 4 }, { offset: 1_000_000, length: 16 }, { offset: 8, length: 8 }];
    for (const loc of [model, `${server.url}/m.gguf`]) {
      const got = await readByteRanges(loc, ranges);
      ranges.forEach((r, i) => expect(Buffer.compare(got[i]!, original.subarray(r.offset, r.offset + r.length))).toBe(0));
      const reader = await openByteReader(loc);
      const chunks: Uint8Array[] = [];
      for await (const c of reader.stream()) chunks.push(c);
      await reader.close();
      expect(Buffer.compare(Buffer.concat(chunks), original)).toBe(0);
    }
  });

  it('openArtifactReader reads several files (a local one and a URL) as their concatenation: ranges across the seam, short reads named', async () => {
    // the model cut at an odd byte into two "files": one local, one served over HTTP
    const cut = 400_001;
    const head = join(dir, 'head.bin');
    writeFileSync(head, original.subarray(0, cut));
    server.set('/tail.bin', original.subarray(cut));
    const reader = await openArtifactReader([head, `${server.url}/tail.bin`], [cut, original.length - cut]);
    try {
      const ranges = [
        { offset: cut - 10, length: 30 }, // across the seam
        { offset: 0, length: 4 },
        { offset: cut, length: 8 }, // the second file's first bytes
        { offset: original.length - 5, length: 5 },
        { offset: 12, length: 0 },
      ];
      const got = await reader.readRanges(ranges);
      ranges.forEach((r, i) => expect(Buffer.compare(got[i]!, original.subarray(r.offset, r.offset + r.length)), `range ${i}`).toBe(0));
      const chunks: Uint8Array[] = [];
      for await (const c of reader.stream()) chunks.push(c);
      expect(Buffer.compare(Buffer.concat(chunks), original)).toBe(0);
      let err: unknown;
      try {
        await reader.readRanges([{ offset: original.length - 2, length: 4 }], ["tensor 'past.end'"]);
      } catch (e) {
        err = e;
      }
      expect(isMeshError(err, 'SHORT_READ')).toBe(true);
      expect((err as Error).message).toContain('past.end');
    } finally {
      await reader.close();
    }
  });
});
