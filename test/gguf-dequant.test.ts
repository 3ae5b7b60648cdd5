// Our dequantisation against ggml's own (libggml-base.so through koffi): every output bit
// must match, on random raw blocks and on data quantised by ggml.
import { describe, expect, it } from 'vitest';
import { dequantize, dequantizeRow, DEQUANT_TYPES } from '../src/gguf/dequant.ts';
import { f32ToF16 } from '../src/gguf/fp16.ts';
import { GgmlType, TYPE_TRAITS, typeName } from '../src/gguf/types.ts';
import { isMeshError } from '../src/errors.ts';
import { ggmlDequantize, ggmlQuantize, ggmlBlockSize, ggmlTypeSize, ggmlTypeName } from './support/ggml-ffi.ts';
import { traitsOf } from '../src/gguf/traits.ts';
import { expectBitwiseEqual, randomBlocks } from './support/random-blocks.ts';
import { mulberry32 } from './support/prng.ts';

describe('dequantize matches ggml bit for bit', () => {
  it('our block geometry equals ggml\'s', () => {
    for (const type of DEQUANT_TYPES) {
      expect(TYPE_TRAITS[type]!.blockSize, typeName(type)).toBe(ggmlBlockSize(type));
      expect(TYPE_TRAITS[type]!.typeSize, typeName(type)).toBe(ggmlTypeSize(type));
    }
  });

  it('traitsOf knows the geometry of the types we only locate (i-quants, ternary) as ggml does', () => {
    for (const type of [16, 17, 18, 19, 21, 22, 29, 34, 35, 20, 23, 39]) {
      expect(traitsOf(type), `type ${type}`).toEqual({ name: ggmlTypeName(type).toUpperCase(), blockSize: ggmlBlockSize(type), typeSize: ggmlTypeSize(type) });
    }
  });

  for (const type of DEQUANT_TYPES) {
    it(`${typeName(type)}: random raw blocks`, () => {
      const t = TYPE_TRAITS[type]!;
      const nElements = t.blockSize === 1 ? 4096 : 64 * t.blockSize;
      for (const seed of [1, 2, 3]) {
        const bytes = randomBlocks(type, nElements / t.blockSize, seed * 1000 + type);
        expectBitwiseEqual(dequantize(type, bytes, nElements), ggmlDequantize(type, bytes, nElements), `${typeName(type)} seed ${seed}`);
      }
    });

    it(`${typeName(type)}: data quantised by ggml`, () => {
      const r = mulberry32(77 + type);
      const nPerRow = 512;
      const nRows = 8;
      // gaussian-ish weights with a few outliers, as real tensors have
      const x = new Float32Array(nRows * nPerRow).map(() => (r() + r() + r() - 1.5) * 0.05 + (r() < 0.01 ? (r() - 0.5) * 4 : 0));
      const q = ggmlQuantize(type, x, nRows, nPerRow);
      expectBitwiseEqual(dequantize(type, q, x.length), ggmlDequantize(type, q, x.length), `${typeName(type)} quantised`);
    });
  }
});

describe('dequantizeRow', () => {
  it('dequantises one row at any byte offset into any output offset', () => {
    for (const type of [GgmlType.Q4_K, GgmlType.Q8_0, GgmlType.F32, GgmlType.F16]) {
      const t = TYPE_TRAITS[type]!;
      const ne0 = 256;
      const rowBytes = (ne0 / t.blockSize) * t.typeSize;
      const raw = randomBlocks(type, (3 * ne0) / t.blockSize, 5);
      const whole = dequantize(type, raw, 3 * ne0);
      // an odd prefix makes F32 rows unaligned
      const shifted = new Uint8Array(raw.length + 1);
      shifted.set(raw, 1);
      const out = new Float32Array(ne0 + 7);
      dequantizeRow(type, shifted, 1 + 2 * rowBytes, ne0, out, 7);
      expectBitwiseEqual(out.subarray(7), whole.subarray(2 * ne0), `${typeName(type)} row 2`);
    }
  });

  it('UNSUPPORTED_TENSOR_TYPE names the type; partial blocks and short buffers are refused', () => {
    const err = (() => { try { dequantize(GgmlType.IQ2_XXS, new Uint8Array(66), 256); } catch (e) { return e; } })();
    expect(isMeshError(err, 'UNSUPPORTED_TENSOR_TYPE')).toBe(true);
    expect((err as Error).message).toContain('IQ2_XXS');
    const err2 = (() => { try { dequantize(GgmlType.Q4_0, new Uint8Array(18), 16); } catch (e) { return e; } })();
    expect(isMeshError(err2, 'BAD_TENSOR_SIZE')).toBe(true);
    const err3 = (() => { try { dequantize(GgmlType.Q4_0, new Uint8Array(17), 32); } catch (e) { return e; } })();
    expect(isMeshError(err3, 'BAD_TENSOR_SIZE')).toBe(true);
  });

  it('f16 round trip of simple values', () => {
    const bytes = new Uint8Array(4);
    const v = new DataView(bytes.buffer);
    v.setUint16(0, f32ToF16(1.5), true);
    v.setUint16(2, f32ToF16(-0.25), true);
    expect([...dequantize(GgmlType.F16, bytes, 2)]).toEqual([1.5, -0.25]);
  });
});
