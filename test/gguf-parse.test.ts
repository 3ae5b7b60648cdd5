import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readHeader, traitsOf } from '../src/gguf/parse.ts';
import { GgmlType } from '../src/gguf/types.ts';
import { isMeshError } from '../src/errors.ts';
import { stories260K } from './support/models.ts';
import { startRangeServer } from './support/range-server.ts';
import type { RangeServer } from './support/range-server.ts';

let model: string;
let original: Uint8Array;
let dir: string;

/** byte offset of the u32 type field of the first tensor info (token_embd.weight, 2 dims) */
function firstTensorTypeOffset(bytes: Uint8Array, tensorInfoStart: number): number {
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  const nameLen = Number(view.getBigUint64(tensorInfoStart, true));
  const nDims = view.getUint32(tensorInfoStart + 8 + nameLen, true);
  return tensorInfoStart + 8 + nameLen + 4 + 8 * nDims;
}

function writeVariant(name: string, bytes: Uint8Array): string {
  const p = join(dir, name);
  writeFileSync(p, bytes);
  return p;
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'resolved';
  } catch (e) {
    if (!isMeshError(e)) throw e;
    return e.code;
  }
}

beforeAll(async () => {
  model = await stories260K();
  original = new Uint8Array(readFileSync(model));
  dir = mkdtempSync(join(tmpdir(), 'gguf-parse-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('readHeader on stories260K', () => {
  it('reads metadata and absolute tensor ranges that tile the data section', async () => {
    const h = await readHeader(model);
    expect(h.version).toBe(3);
    expect(h.fileBytes).toBe(original.length);
    expect(h.metadata['general.architecture']).toBe('llama');
    expect(h.metadata['llama.block_count']).toBe(5);
    expect(h.metadata['version']).toBeUndefined();
    expect(h.tensors).toHaveLength(48);
    expect(h.alignment).toBe(32);
    expect(h.tensorDataOffset % 32).toBe(0);
    const embd = h.tensors.find((t) => t.name === 'token_embd.weight')!;
    expect(embd).toMatchObject({ type: GgmlType.F32, shape: [64, 512], nElements: 32768, offset: h.tensorDataOffset, byteLength: 131072 });
    // the tensors are laid out back to back (F32 sizes are multiples of 32): the last ends at EOF
    const sorted = [...h.tensors].sort((a, b) => a.offset - b.offset);
    for (let i = 1; i < sorted.length; i++) {
      const prev = sorted[i - 1]!;
      expect(sorted[i]!.offset).toBe(prev.offset + Math.ceil(prev.byteLength / 32) * 32);
    }
    const last = sorted.at(-1)!;
    expect(last.offset + last.byteLength).toBe(original.length);
    // the first bytes of token_embd are the f32 values stored there
    const f = new DataView(original.buffer, original.byteOffset + embd.offset, 8);
    expect(Number.isFinite(f.getFloat32(0, true))).toBe(true);
  });

  it('gives the same header over HTTP Range requests, with the size from Content-Range', async () => {
    const server = await startRangeServer();
    try {
      server.set('/m.gguf', original);
      const local = await readHeader(model);
      const remote = await readHeader(`${server.url}/m.gguf`);
      expect(remote).toEqual(local);
      expect(server.requests.every((r) => r.range !== undefined)).toBe(true);
    } finally {
      await server.close();
    }
  });
});

describe('readHeader errors', () => {
  it('GGUF_NOT_GGUF for foreign bytes and for an empty file', async () => {
    expect(await codeOf(readHeader(writeVariant('text.gguf', new TextEncoder().encode('hello world, this is not a gguf file at all'))))).toBe('GGUF_NOT_GGUF');
    expect(await codeOf(readHeader(writeVariant('empty.gguf', new Uint8Array(0))))).toBe('GGUF_NOT_GGUF');
  });

  it('GGUF_BAD_VERSION for v1 and v7', async () => {
    for (const v of [1, 7]) {
      const b = original.slice();
      new DataView(b.buffer).setUint32(4, v, true);
      const err = await readHeader(writeVariant(`v${v}.gguf`, b)).catch((e: unknown) => e);
      expect(isMeshError(err, 'GGUF_BAD_VERSION')).toBe(true);
      expect((err as Error).message).toContain(`version ${v}`);
    }
  });

  it('GGUF_TRUNCATED_HEADER when the file ends inside the header', async () => {
    for (const n of [2, 10, 23, 100, 5000, 11_400, 14_000]) {
      const err = await readHeader(writeVariant(`cut${n}.gguf`, original.slice(0, n))).catch((e: unknown) => e);
      expect(isMeshError(err, 'GGUF_TRUNCATED_HEADER'), `cut at ${n}: ${String(err)}`).toBe(true);
    }
  });

  it('GGUF_DATA_PAST_EOF names the tensor; allowTruncatedData accepts a header-only file', async () => {
    const p = writeVariant('short-data.gguf', original.slice(0, original.length - 100));
    const err = await readHeader(p).catch((e: unknown) => e);
    expect(isMeshError(err, 'GGUF_DATA_PAST_EOF')).toBe(true);
    expect((err as Error).message).toContain('blk.4.ffn_norm.weight');
    const h0 = await readHeader(model);
    const headerOnly = await readHeader(writeVariant('header-only.gguf', original.slice(0, h0.tensorDataOffset)), {
      allowTruncatedData: true,
    });
    expect(headerOnly.tensors).toEqual(h0.tensors);
    expect(headerOnly.fileBytes).toBe(h0.tensorDataOffset);
  });

  it('GGUF_UNKNOWN_TYPE names the tensor and the type id', async () => {
    const h0 = await readHeader(model);
    const b = original.slice();
    // tensor infos start right after the metadata; find token_embd.weight's type field
    const nameBytes = new TextEncoder().encode('token_embd.weight');
    let start = -1;
    for (let i = 0; i < h0.tensorDataOffset; i++) {
      if (nameBytes.every((c, j) => b[i + j] === c)) { start = i - 8; break; }
    }
    expect(start).toBeGreaterThan(0);
    new DataView(b.buffer).setUint32(firstTensorTypeOffset(b, start), 99, true);
    const err = await readHeader(writeVariant('unknown-type.gguf', b)).catch((e: unknown) => e);
    expect(isMeshError(err, 'GGUF_UNKNOWN_TYPE')).toBe(true);
    expect((err as Error).message).toContain('token_embd.weight');
    expect((err as Error).message).toContain('99');
  });

  it('GGUF_NOT_FOUND for a missing path', async () => {
    expect(await codeOf(readHeader(join(dir, 'nope.gguf')))).toBe('GGUF_NOT_FOUND');
  });

  describe('over HTTP', () => {
    let server: RangeServer;
    let plain: RangeServer;
    beforeAll(async () => {
      server = await startRangeServer();
      plain = await startRangeServer({ ignoreRange: true });
    });
    afterAll(async () => {
      await server.close();
      await plain.close();
    });

    it('RANGE_NOT_SUPPORTED when the server ignores Range', async () => {
      plain.set('/m.gguf', original);
      expect(await codeOf(readHeader(`${plain.url}/m.gguf`))).toBe('RANGE_NOT_SUPPORTED');
    });

    it('HTTP_ERROR on 404; the same header errors as for files', async () => {
      expect(await codeOf(readHeader(`${server.url}/missing.gguf`))).toBe('HTTP_ERROR');
      server.set('/cut.gguf', original.slice(0, 5000));
      expect(await codeOf(readHeader(`${server.url}/cut.gguf`))).toBe('GGUF_TRUNCATED_HEADER');
      server.set('/tiny.gguf', original.slice(0, 10));
      expect(await codeOf(readHeader(`${server.url}/tiny.gguf`))).toBe('GGUF_TRUNCATED_HEADER');
      server.set('/text.gguf', new TextEncoder().encode('not a gguf, just some text here....'));
      expect(await codeOf(readHeader(`${server.url}/text.gguf`))).toBe('GGUF_NOT_GGUF');
      server.set('/short.gguf', original.slice(0, original.length - 1));
      expect(await codeOf(readHeader(`${server.url}/short.gguf`))).toBe('GGUF_DATA_PAST_EOF');
    });
  });
});

describe('traitsOf', () => {
  it('knows the block geometry of every type in GgmlType', () => {
    for (const v of Object.values(GgmlType)) {
      if (typeof v !== 'number') continue;
      if (v === GgmlType.Q8_1 || v === GgmlType.Q8_K) continue; // never stored in GGUF files, but listed anyway
      expect(traitsOf(v), GgmlType[v]).toBeDefined();
    }
    expect(traitsOf(1234)).toBeUndefined();
  });
});
