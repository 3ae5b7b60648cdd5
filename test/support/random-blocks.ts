// Random raw blocks of any ggml type (finite scales and floats, every quant bit pattern) and a
// bit-for-bit comparison of two f32 arrays: the inputs and the check of the dequantisation
// tests against ggml's own to_float.
import { expect } from 'vitest';
import { GgmlType, TYPE_TRAITS } from '../../src/gguf/types.ts';
import { mulberry32 } from './prng.ts';

/** a random finite f16 bit pattern (subnormals and both signs included, no Inf/NaN) */
function randomF16(r: () => number): number {
  for (;;) {
    const bits = Math.floor(r() * 65536);
    if (((bits >> 10) & 0x1f) !== 0x1f) return bits;
  }
}

/** byte offsets of the f16 scale fields inside one block */
const F16_FIELDS: Partial<Record<GgmlType, number[]>> = {
  [GgmlType.Q4_0]: [0],
  [GgmlType.Q4_1]: [0, 2],
  [GgmlType.Q5_0]: [0],
  [GgmlType.Q5_1]: [0, 2],
  [GgmlType.Q8_0]: [0],
  [GgmlType.Q2_K]: [80, 82],
  [GgmlType.Q3_K]: [108],
  [GgmlType.Q4_K]: [0, 2],
  [GgmlType.Q5_K]: [0, 2],
  [GgmlType.Q6_K]: [208],
  [GgmlType.IQ4_NL]: [0],
  [GgmlType.IQ4_XS]: [0],
};

/** random raw bytes for nBlocks blocks of a type, with finite scales (and finite floats) */
export function randomBlocks(type: GgmlType, nBlocks: number, seed: number): Uint8Array {
  const r = mulberry32(seed);
  const t = TYPE_TRAITS[type]!;
  const bytes = new Uint8Array(nBlocks * t.typeSize);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(r() * 256);
  const put16 = (o: number, v: number) => {
    bytes[o] = v & 0xff;
    bytes[o + 1] = v >> 8;
  };
  if (type === GgmlType.F16) for (let o = 0; o < bytes.length; o += 2) put16(o, randomF16(r));
  if (type === GgmlType.BF16) {
    for (let o = 0; o < bytes.length; o += 2) if (((bytes[o + 1]! & 0x7f) << 1 | bytes[o]! >> 7) === 0xff) bytes[o + 1]! ^= 0x40; // no Inf/NaN
  }
  if (type === GgmlType.F32) {
    for (let o = 0; o < bytes.length; o += 4) if ((((bytes[o + 3]! & 0x7f) << 1) | (bytes[o + 2]! >> 7)) === 0xff) bytes[o + 3]! ^= 0x40;
  }
  for (const field of F16_FIELDS[type] ?? []) {
    for (let b = 0; b < nBlocks; b++) put16(b * t.typeSize + field, randomF16(r));
  }
  return bytes;
}

export function expectBitwiseEqual(ours: Float32Array, theirs: Float32Array, label: string): void {
  expect(ours.length, label).toBe(theirs.length);
  const a = new Uint32Array(ours.buffer, ours.byteOffset, ours.length);
  const b = new Uint32Array(theirs.buffer, theirs.byteOffset, theirs.length);
  let mismatches = 0;
  let first = -1;
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      if (first < 0) first = i;
      mismatches++;
    }
  }
  expect(mismatches, `${label}: ${mismatches} mismatches, first at ${first}: ours ${ours[first]} ggml ${theirs[first]}`).toBe(0);
}
