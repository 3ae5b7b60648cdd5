// The GGUF writer and the quantisers: files read back through @huggingface/gguf and the
// project's readHeader; quantised bytes equal ggml's own quantize_chunk, byte for byte.
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gguf } from '@huggingface/gguf';
import { afterAll, describe, expect, it } from 'vitest';
import { dequantize } from '../src/gguf/dequant.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { quantize } from '../src/gguf/quantize.ts';
import { GgmlType, tensorBytes } from '../src/gguf/types.ts';
import type { MetadataEntry, TensorSpec } from '../src/gguf/writer.ts';
import { GgufValueType, planGguf, writeGguf, writeGgufFile } from '../src/gguf/writer.ts';
import { ggmlQuantize } from './support/ggml-ffi.ts';
import { lcgCentered } from './support/prng.ts';

const dir = mkdtempSync(join(tmpdir(), 'gguf-writer-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function save(name: string, bytes: Uint8Array): string {
  const p = join(dir, name);
  writeFileSync(p, bytes);
  return p;
}

/** A deterministic mix of values that exercises quantiser corner cases. */
function testValues(n: number, seed: number): Float32Array {
  const x = new Float32Array(n); // [n] f32
  const next = lcgCentered(seed);
  for (let i = 0; i < n; i++) {
    const block = Math.floor(i / 256) % 8;
    if (block === 1) x[i] = 0; // an all-zero super-block
    else if (block === 2) x[i] = 0.125; // a constant block
    else if (block === 3) x[i] = next() * 1e-6; // tiny values
    else if (block === 4) x[i] = next() + 0.3; // all positive (min clamps to 0 in K-quants)
    else x[i] = next() * 0.2 + (i % 61 === 0 ? next() * 8 : 0); // outliers
  }
  return x;
}

const ALL_SCALARS: MetadataEntry[] = [
  { key: 't.u8', type: 'uint8', value: 255 },
  { key: 't.i8', type: 'int8', value: -128 },
  { key: 't.u16', type: 'uint16', value: 65535 },
  { key: 't.i16', type: 'int16', value: -32768 },
  { key: 't.u32', type: 'uint32', value: 4294967295 },
  { key: 't.i32', type: 'int32', value: -2147483648 },
  { key: 't.f32', type: 'float32', value: 0.1 },
  { key: 't.bool', type: 'bool', value: true },
  { key: 't.str', type: 'string', value: 'héllo ▁ 世界 🙂' },
  { key: 't.u64', type: 'uint64', value: 18446744073709551615n },
  { key: 't.i64', type: 'int64', value: -9223372036854775808n },
  { key: 't.f64', type: 'float64', value: 0.1 },
  { key: 't.arr.u8', type: 'array', itemType: 'uint8', value: [0, 1, 255] },
  { key: 't.arr.i8', type: 'array', itemType: 'int8', value: [-1, 127] },
  { key: 't.arr.u16', type: 'array', itemType: 'uint16', value: [7, 65535] },
  { key: 't.arr.i16', type: 'array', itemType: 'int16', value: [-7] },
  { key: 't.arr.u32', type: 'array', itemType: 'uint32', value: [1, 2, 3] },
  { key: 't.arr.i32', type: 'array', itemType: 'int32', value: Int32Array.from([-1, 0, 1]) },
  { key: 't.arr.f32', type: 'array', itemType: 'float32', value: Float32Array.from([0.5, -2]) },
  { key: 't.arr.bool', type: 'array', itemType: 'bool', value: [true, false] },
  { key: 't.arr.str', type: 'array', itemType: 'string', value: ['a', '', '▁the', '<0x0A>'] },
  { key: 't.arr.u64', type: 'array', itemType: 'uint64', value: [1n, 2n ** 40n] },
  { key: 't.arr.i64', type: 'array', itemType: 'int64', value: [-5n] },
  { key: 't.arr.f64', type: 'array', itemType: 'float64', value: [1.5, -0.25] },
  { key: 't.arr.empty', type: 'array', itemType: 'string', value: [] },
];

const EXPECTED_TYPE: Record<string, GgufValueType> = {
  uint8: GgufValueType.UINT8, int8: GgufValueType.INT8, uint16: GgufValueType.UINT16, int16: GgufValueType.INT16,
  uint32: GgufValueType.UINT32, int32: GgufValueType.INT32, float32: GgufValueType.FLOAT32, bool: GgufValueType.BOOL,
  string: GgufValueType.STRING, uint64: GgufValueType.UINT64, int64: GgufValueType.INT64, float64: GgufValueType.FLOAT64,
};

/** What a reader should give back for an entry (f32 values come back rounded to f32). */
function expectedValue(e: MetadataEntry): unknown {
  const one = (kind: string, v: unknown): unknown => {
    if (kind === 'float32') return Math.fround(v as number);
    if (kind === 'uint64' || kind === 'int64') return BigInt(v as bigint);
    return v;
  };
  if (e.type === 'array') return Array.from(e.value as ArrayLike<unknown>, (v) => one(e.itemType, v));
  return one(e.type, e.value);
}

function tensorOf(name: string, type: GgmlType, shape: number[], seed: number): TensorSpec & { values: Float32Array } {
  const values = testValues(shape.reduce((a, b) => a * b, 1), seed);
  return { name, type, shape, values, data: quantize(type, values, shape[0]) };
}

describe('GGUF writer', () => {
  it('writes every metadata value type so that @huggingface/gguf and readHeader read them back', async () => {
    const metadata: MetadataEntry[] = [{ key: 'general.architecture', type: 'string', value: 'llama' }, ...ALL_SCALARS];
    const path = save('meta.gguf', writeGguf({ metadata, tensors: [] }));

    const parsed = await gguf(path, { allowLocalFile: true, typedMetadata: true });
    const typed = parsed.typedMetadata as unknown as Record<string, { value: unknown; type: number; subType?: number }>;
    for (const e of ALL_SCALARS) {
      const got = typed[e.key];
      expect(got, e.key).toBeDefined();
      if (e.type === 'array') {
        expect(got!.type, e.key).toBe(GgufValueType.ARRAY);
        expect(got!.subType, e.key).toBe(EXPECTED_TYPE[e.itemType]);
      } else {
        expect(got!.type, e.key).toBe(EXPECTED_TYPE[e.type]);
      }
      const want = expectedValue(e);
      const have = e.type === 'array' ? Array.from(got!.value as unknown[], (v) => (typeof want === 'object' && typeof (want as unknown[])[0] === 'bigint' ? BigInt(v as bigint) : v)) : got!.value;
      expect(have, e.key).toEqual(want);
    }

    const header = await readHeader(path);
    expect(header.version).toBe(3);
    expect(header.tensors).toHaveLength(0);
    expect(header.metadata['t.str']).toBe('héllo ▁ 世界 🙂');
    expect(header.metadata['t.arr.str']).toEqual(['a', '', '▁the', '<0x0A>']);
    expect(header.metadata['t.u32']).toBe(4294967295);
  });

  it('places tensors of every type at aligned offsets that readHeader reports, with the data intact', async () => {
    const tensors = [
      tensorOf('a.f32', GgmlType.F32, [7, 3], 1), // 84 bytes: the next tensor needs padding
      tensorOf('b.f16', GgmlType.F16, [33], 2),
      tensorOf('c.q8_0', GgmlType.Q8_0, [64, 2], 3),
      tensorOf('d.q4_0', GgmlType.Q4_0, [96], 4),
      tensorOf('e.q4_k', GgmlType.Q4_K, [512, 3], 5),
      tensorOf('f.q6_k', GgmlType.Q6_K, [256, 2, 2], 6),
    ];
    const spec = { metadata: [{ key: 'general.architecture', type: 'string', value: 'llama' } as MetadataEntry], tensors };
    const bytes = writeGguf(spec);
    const path = save('tensors.gguf', bytes);
    const layout = planGguf(spec);
    expect(layout.fileBytes).toBe(bytes.length);

    const header = await readHeader(path);
    expect(header.alignment).toBe(32);
    expect(header.tensorDataOffset).toBe(layout.tensorDataOffset);
    expect(header.tensorDataOffset % 32).toBe(0);
    expect(header.fileBytes).toBe(bytes.length);
    for (const [i, t] of tensors.entries()) {
      const info = header.tensors[i]!;
      expect(info.name).toBe(t.name);
      expect(info.type).toBe(t.type);
      expect(info.shape).toEqual(t.shape);
      expect(info.offset % 32).toBe(0);
      expect(info.offset).toBe(layout.tensors[i]!.offset);
      expect(info.byteLength).toBe(tensorBytes(t.type, t.values.length));
      const stored = bytes.subarray(info.offset, info.offset + info.byteLength);
      expect(Buffer.from(stored).equals(Buffer.from(t.data as Uint8Array))).toBe(true);
      if (t.type === GgmlType.F32) expect(dequantize(t.type, stored, t.values.length)).toEqual(t.values);
    }

    const hf = await gguf(path, { allowLocalFile: true });
    expect(hf.tensorInfos.map((t) => t.name)).toEqual(tensors.map((t) => t.name));
    expect(hf.tensorInfos.map((t) => Number(t.offset))).toEqual(layout.tensors.map((t) => t.offset - layout.tensorDataOffset));
  });

  it('honours general.alignment', async () => {
    const tensors = [tensorOf('x', GgmlType.F32, [3], 1), tensorOf('y', GgmlType.F32, [5], 2)];
    const metadata: MetadataEntry[] = [{ key: 'general.alignment', type: 'uint32', value: 256 }];
    const header = await readHeader(save('align.gguf', writeGguf({ metadata, tensors })));
    expect(header.alignment).toBe(256);
    expect(header.tensorDataOffset % 256).toBe(0);
    expect(header.tensors.map((t) => t.offset - header.tensorDataOffset)).toEqual([0, 256]);
    expect(() => writeGguf({ metadata: [{ key: 'general.alignment', type: 'uint32', value: 48 }], tensors: [] })).toThrow(/power of two/);
    expect(() => writeGguf({ metadata: [{ key: 'general.alignment', type: 'int32', value: 64 }], tensors: [] })).toThrow(/uint32/);
  });

  it('streams to a file the same bytes it builds in memory, pulling tensor data piece by piece', async () => {
    const values = testValues(256 * 8, 9);
    let pulls = 0;
    const rows = (type: GgmlType) => function* () {
      for (let r = 0; r < 8; r++) {
        pulls++;
        yield quantize(type, values.subarray(r * 256, r * 256 + 256), 256);
      }
    };
    const spec = {
      metadata: [{ key: 'general.name', type: 'string', value: 'stream' } as MetadataEntry],
      tensors: [
        { name: 'q', type: GgmlType.Q4_K, shape: [256, 8], data: rows(GgmlType.Q4_K) },
        { name: 'e', type: GgmlType.Q8_0, shape: [256, 8], data: rows(GgmlType.Q8_0) },
      ],
    };
    const inMemory = writeGguf(spec);
    const path = join(dir, 'stream.gguf');
    const layout = await writeGgufFile(path, spec);
    expect(pulls).toBe(32);
    const onDisk = readFileSync(path);
    expect(layout.fileBytes).toBe(onDisk.length);
    expect(createHash('sha256').update(onDisk).digest('hex')).toBe(createHash('sha256').update(inMemory).digest('hex'));
    expect(onDisk.subarray(layout.tensors[0]!.offset, layout.tensors[0]!.offset + layout.tensors[0]!.byteLength)).toEqual(
      Buffer.from(quantize(GgmlType.Q4_K, values, 256)),
    );
  });

  it('writes header-only files: full tensor infos and offsets of a huge model, no data', async () => {
    // a 80-layer-like tensor list whose data would be ~300 GB
    const tensors: TensorSpec[] = [];
    for (let i = 0; i < 80; i++) tensors.push({ name: `blk.${i}.ffn_down.weight`, type: GgmlType.Q8_0, shape: [16384, 131072] });
    const path = join(dir, 'header-only.gguf');
    const layout = await writeGgufFile(path, { metadata: [], tensors, headerOnly: true });
    expect(statSync(path).size).toBe(layout.tensorDataOffset);
    expect(statSync(path).size).toBeLessThan(16_384);
    const last = layout.tensors.at(-1)!;
    expect(last.offset + last.byteLength).toBeGreaterThan(150e9);
    const header = await readHeader(path, { allowTruncatedData: true });
    expect(header.tensors).toHaveLength(80);
    expect(header.tensors.at(-1)!.offset).toBe(last.offset);
    expect(header.tensors.at(-1)!.byteLength).toBe(tensorBytes(GgmlType.Q8_0, 16384 * 131072));
    await expect(readHeader(path)).rejects.toThrow();
  });

  it('rejects bad specs with GGUF_WRITE_INVALID and a message naming the problem', () => {
    const t = (type: GgmlType, shape: number[], data?: Uint8Array): TensorSpec => ({ name: 'w', type, shape, ...(data ? { data } : {}) });
    const cases: [() => unknown, RegExp][] = [
      [() => writeGguf({ metadata: [{ key: 'k', type: 'uint8', value: 256 }], tensors: [] }), /does not fit in uint8/],
      [() => writeGguf({ metadata: [{ key: 'k', type: 'int32', value: 1.5 }], tensors: [] }), /needs an integer/],
      [() => writeGguf({ metadata: [{ key: 'k', type: 'string', value: 3 }], tensors: [] }), /needs a string/],
      [() => writeGguf({ metadata: [{ key: 'k', type: 'bool', value: 1 }], tensors: [] }), /true\/false/],
      [() => writeGguf({ metadata: [{ key: 'k', type: 'array', itemType: 'int32', value: [2 ** 31] }], tensors: [] }), /int32/],
      [() => writeGguf({ metadata: [{ key: 'k', type: 'uint8', value: 1 }, { key: 'k', type: 'uint8', value: 1 }], tensors: [] }), /twice/],
      [() => writeGguf({ metadata: [], tensors: [t(GgmlType.Q4_K, [128], new Uint8Array(72))] }), /multiple of the Q4_K block size 256/],
      [() => writeGguf({ metadata: [], tensors: [t(GgmlType.F32, [4], new Uint8Array(15))] }), /got 15 bytes.*need 16/],
      [() => writeGguf({ metadata: [], tensors: [t(GgmlType.F32, [4])] }), /no data/],
      [() => writeGguf({ metadata: [], tensors: [t(GgmlType.F32, [0], new Uint8Array(0))] }), /bad shape/],
      [() => writeGguf({ metadata: [], tensors: [t(99 as GgmlType, [4], new Uint8Array(16))] }), /unknown ggml type/],
    ];
    for (const [fn, message] of cases) {
      expect(fn).toThrow(message);
      try {
        fn();
      } catch (e) {
        expect((e as { code?: string }).code).toBe('GGUF_WRITE_INVALID');
      }
    }
  });
});

describe('quantisers', () => {
  const cases: [GgmlType, number][] = [
    [GgmlType.F16, 1],
    [GgmlType.BF16, 1],
    [GgmlType.Q8_0, 32],
    [GgmlType.Q4_0, 32],
    [GgmlType.Q4_1, 32],
    [GgmlType.Q5_0, 32],
    [GgmlType.Q5_1, 32],
    [GgmlType.Q2_K, 256],
    [GgmlType.Q3_K, 256],
    [GgmlType.Q4_K, 256],
    [GgmlType.Q5_K, 256],
    [GgmlType.Q6_K, 256],
    [GgmlType.IQ4_NL, 32],
    [GgmlType.IQ4_XS, 256],
    [GgmlType.MXFP4, 32],
  ];
  for (const [type, block] of cases) {
    it(`${GgmlType[type]} equals ggml's quantize_chunk byte for byte`, () => {
      const nPerRow = 1024;
      const nRows = 24;
      const values = testValues(nPerRow * nRows, type * 7 + 1);
      const mine = quantize(type, values, nPerRow);
      const ref = ggmlQuantize(type, values, nRows, nPerRow);
      expect(mine.length).toBe(ref.length);
      let firstDiff = -1;
      for (let i = 0; i < ref.length && firstDiff < 0; i++) if (mine[i] !== ref[i]) firstDiff = i;
      expect(firstDiff).toBe(-1);
      // and what comes back is close to the input (a round trip through dequant)
      const back = dequantize(type, mine, values.length);
      let worst = 0;
      for (let i = 0; i < values.length; i++) worst = Math.max(worst, Math.abs(back[i]! - values[i]!));
      // MXFP4's e2m1 grid with a power-of-two block scale is the coarsest (steps of amax/3 at the top)
      expect(worst).toBeLessThan(type === GgmlType.F16 || type === GgmlType.BF16 ? 1e-2 : type === GgmlType.MXFP4 ? 1.2 : 0.6);
      expect(block).toBeGreaterThan(0);
    });
  }

  it('F32 is a plain copy, and bad row lengths or types are refused with codes', () => {
    const v = Float32Array.from([1, -2.5, 3e-8, 0]);
    expect(new Float32Array(quantize(GgmlType.F32, v).buffer)).toEqual(v);
    expect(() => quantize(GgmlType.Q4_K, new Float32Array(128), 128)).toThrow(expect.objectContaining({ code: 'QUANT_BAD_ROW' }));
    expect(() => quantize(GgmlType.Q8_0, new Float32Array(96), 64)).toThrow(expect.objectContaining({ code: 'QUANT_BAD_ROW' }));
    expect(() => quantize(GgmlType.IQ2_XXS, new Float32Array(256))).toThrow(expect.objectContaining({ code: 'QUANT_UNSUPPORTED_TYPE' }));
  });
});
