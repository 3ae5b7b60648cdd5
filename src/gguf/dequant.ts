// Dequantisation of ggml tensor data to f32, bit-exact with ggml's reference CPU code.
//
// Exactness: every f32 operation ggml performs is reproduced as one JS double operation
// followed by Math.fround. For a product or sum of two f32 values the double result rounded
// to f32 equals the f32-rounded result, so the output bits match. Block layouts (bytes):
//   Q4_0  [d f16][16 B nibbles]                      32 elements, 18 B
//   Q4_1  [d f16][m f16][16 B nibbles]               32 elements, 20 B
//   Q5_0  [d f16][qh u32][16 B nibbles]              32 elements, 22 B
//   Q5_1  [d f16][m f16][qh u32][16 B nibbles]       32 elements, 24 B
//   Q8_0  [d f16][32 × i8]                           32 elements, 34 B
//   Q2_K  [scales 16][qs 64][d f16][dmin f16]        256 elements, 84 B
//   Q3_K  [hmask 32][qs 64][scales 12][d f16]        256 elements, 110 B
//   Q4_K  [d f16][dmin f16][scales 12][qs 128]       256 elements, 144 B
//   Q5_K  [d f16][dmin f16][scales 12][qh 32][qs 128] 256 elements, 176 B
//   Q6_K  [ql 128][qh 64][scales 16 × i8][d f16]      256 elements, 210 B
//   IQ4_NL [d f16][16 B codebook nibbles]             32 elements, 18 B
//   IQ4_XS [d f16][scales_h u16][scales_l 4][qs 128]  256 elements, 136 B
//   MXFP4  [e u8 (E8M0)][16 B e2m1 nibbles]           32 elements, 17 B

import { MeshError } from '../errors.ts';
import { F16_TABLE } from './fp16.ts';
import { IQ4_NL_VALUES, MXFP4_VALUES, e8m0Half } from './codebooks.ts';
import { ggmlTypeName as typeName } from './traits.ts';
import { GgmlType, TYPE_TRAITS } from './types.ts';

const fr = Math.fround;

/** The types `dequantize` handles. */
export const DEQUANT_TYPES: readonly GgmlType[] = [
  GgmlType.F32, GgmlType.F16, GgmlType.BF16,
  GgmlType.Q4_0, GgmlType.Q4_1, GgmlType.Q5_0, GgmlType.Q5_1, GgmlType.Q8_0,
  GgmlType.Q2_K, GgmlType.Q3_K, GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K,
  GgmlType.IQ4_NL, GgmlType.IQ4_XS, GgmlType.MXFP4,
];

type RowFn = (b: Uint8Array, o: number, nBlocks: number, y: Float32Array, yo: number) => void;

/** f16 at byte offset o, as f32 */
function h(b: Uint8Array, o: number): number {
  return F16_TABLE[b[o]! | (b[o + 1]! << 8)]!;
}

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

function rowF32(b: Uint8Array, o: number, n: number, y: Float32Array, yo: number): void {
  if ((b.byteOffset + o) % 4 === 0) {
    y.set(new Float32Array(b.buffer, b.byteOffset + o, n), yo);
    return;
  }
  const v = new DataView(b.buffer, b.byteOffset + o, n * 4);
  for (let i = 0; i < n; i++) y[yo + i] = v.getFloat32(i * 4, true);
}

function rowF16(b: Uint8Array, o: number, n: number, y: Float32Array, yo: number): void {
  if ((b.byteOffset + o) % 2 === 0) {
    const u = new Uint16Array(b.buffer, b.byteOffset + o, n);
    for (let i = 0; i < n; i++) y[yo + i] = F16_TABLE[u[i]!]!;
    return;
  }
  for (let i = 0; i < n; i++) y[yo + i] = h(b, o + 2 * i);
}

function rowBF16(b: Uint8Array, o: number, n: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < n; i++) {
    scratchU32[0] = (b[o + 2 * i]! | (b[o + 2 * i + 1]! << 8)) << 16;
    y[yo + i] = scratchF32[0]!;
  }
}

function rowQ4_0(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 18, yo += 32) {
    const d = h(b, o);
    for (let j = 0; j < 16; j++) {
      const q = b[o + 2 + j]!;
      y[yo + j] = fr(((q & 0x0f) - 8) * d);
      y[yo + j + 16] = fr(((q >> 4) - 8) * d);
    }
  }
}

function rowQ4_1(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 20, yo += 32) {
    const d = h(b, o);
    const m = h(b, o + 2);
    for (let j = 0; j < 16; j++) {
      const q = b[o + 4 + j]!;
      y[yo + j] = fr(fr((q & 0x0f) * d) + m);
      y[yo + j + 16] = fr(fr((q >> 4) * d) + m);
    }
  }
}

function u32At(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

function rowQ5_0(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 22, yo += 32) {
    const d = h(b, o);
    const qh = u32At(b, o + 2);
    for (let j = 0; j < 16; j++) {
      const q = b[o + 6 + j]!;
      const hi0 = ((qh >>> j) << 4) & 0x10; // bit j is element j's 5th bit
      const hi1 = (qh >>> (j + 12)) & 0x10; // bit j+16 is element j+16's
      y[yo + j] = fr((((q & 0x0f) | hi0) - 16) * d);
      y[yo + j + 16] = fr((((q >> 4) | hi1) - 16) * d);
    }
  }
}

function rowQ5_1(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 24, yo += 32) {
    const d = h(b, o);
    const m = h(b, o + 2);
    const qh = u32At(b, o + 4);
    for (let j = 0; j < 16; j++) {
      const q = b[o + 8 + j]!;
      const hi0 = ((qh >>> j) << 4) & 0x10;
      const hi1 = (qh >>> (j + 12)) & 0x10;
      y[yo + j] = fr(fr(((q & 0x0f) | hi0) * d) + m);
      y[yo + j + 16] = fr(fr(((q >> 4) | hi1) * d) + m);
    }
  }
}

function rowQ8_0(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 34, yo += 32) {
    const d = h(b, o);
    for (let j = 0; j < 32; j++) y[yo + j] = fr(((b[o + 2 + j]! << 24) >> 24) * d);
  }
}

function rowQ2_K(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 84) {
    const d = h(b, o + 80);
    const dmin = h(b, o + 82);
    let is = 0;
    for (let half = 0; half < 2; half++) {
      const qs = o + 16 + half * 32; // 32 bytes hold 4 bit-planes of 32 elements
      for (let shift = 0; shift < 8; shift += 2) {
        for (let part = 0; part < 2; part++) {
          const sc = b[o + is++]!;
          const dl = fr(d * (sc & 0xf));
          const ml = fr(dmin * (sc >> 4));
          const q = qs + part * 16;
          for (let l = 0; l < 16; l++) y[yo++] = fr(fr(dl * ((b[q + l]! >> shift) & 3)) - ml);
        }
      }
    }
  }
}

/** Unpacks Q3_K's twelve bytes into sixteen 6-bit scales (still offset by 32). */
function q3kScales(b: Uint8Array, o: number, out: Int32Array): void {
  for (let k = 0; k < 16; k++) {
    const low = k < 8 ? b[o + k]! & 0x0f : b[o + k - 8]! >> 4;
    const high = (b[o + 8 + (k & 3)]! >> (2 * (k >> 2))) & 3;
    out[k] = low | (high << 4);
  }
}

const q3Scales = new Int32Array(16);

function rowQ3_K(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 110) {
    const d = h(b, o + 108);
    q3kScales(b, o + 96, q3Scales);
    let is = 0;
    let bit = 0; // the hmask bit holding this group's high bits
    for (let half = 0; half < 2; half++) {
      const qs = o + 32 + half * 32;
      for (let shift = 0; shift < 8; shift += 2, bit++) {
        for (let part = 0; part < 2; part++) {
          const dl = fr(d * (q3Scales[is++]! - 32));
          const q = qs + part * 16;
          const hm = o + part * 16;
          for (let l = 0; l < 16; l++) {
            // 2 low bits, minus 4 when the high bit is clear
            const v = ((b[q + l]! >> shift) & 3) - ((((b[hm + l]! >> bit) & 1) ^ 1) << 2);
            y[yo++] = fr(dl * v);
          }
        }
      }
    }
  }
}

/**
 * Unpacks the eight (scale, min) pairs of the 12-byte 6-bit packing used by Q4_K and Q5_K:
 * pairs 0-3 are the low 6 bits of bytes 0-3 / 4-7; pairs 4-7 take their low 4 bits from
 * bytes 8-11 and their top 2 bits from the spare high bits of bytes 0-7.
 */
function scaleMinK4(b: Uint8Array, o: number, sc: Int32Array, mn: Int32Array): void {
  for (let j = 0; j < 4; j++) {
    sc[j] = b[o + j]! & 63;
    mn[j] = b[o + j + 4]! & 63;
    sc[j + 4] = (b[o + j + 8]! & 0x0f) | ((b[o + j]! >> 6) << 4);
    mn[j + 4] = (b[o + j + 8]! >> 4) | ((b[o + j + 4]! >> 6) << 4);
  }
}

const kScales = new Int32Array(8);
const kMins = new Int32Array(8);

function rowQ4_K(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 144) {
    const d = h(b, o);
    const dmin = h(b, o + 2);
    scaleMinK4(b, o + 4, kScales, kMins);
    for (let j = 0; j < 4; j++) {
      const d1 = fr(d * kScales[2 * j]!), m1 = fr(dmin * kMins[2 * j]!);
      const d2 = fr(d * kScales[2 * j + 1]!), m2 = fr(dmin * kMins[2 * j + 1]!);
      const q = o + 16 + 32 * j;
      for (let l = 0; l < 32; l++) {
        const v = b[q + l]!;
        y[yo + l] = fr(fr(d1 * (v & 0x0f)) - m1);
        y[yo + 32 + l] = fr(fr(d2 * (v >> 4)) - m2);
      }
      yo += 64;
    }
  }
}

function rowQ5_K(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 176) {
    const d = h(b, o);
    const dmin = h(b, o + 2);
    scaleMinK4(b, o + 4, kScales, kMins);
    const qh = o + 16;
    for (let j = 0; j < 4; j++) {
      const d1 = fr(d * kScales[2 * j]!), m1 = fr(dmin * kMins[2 * j]!);
      const d2 = fr(d * kScales[2 * j + 1]!), m2 = fr(dmin * kMins[2 * j + 1]!);
      const s1 = 2 * j, s2 = 2 * j + 1; // bit of qh[l] holding each half's 5th bit
      const q = o + 48 + 32 * j;
      for (let l = 0; l < 32; l++) {
        const v = b[q + l]!;
        const hb = b[qh + l]!;
        y[yo + l] = fr(fr(d1 * ((v & 0x0f) | (((hb >> s1) & 1) << 4))) - m1);
        y[yo + 32 + l] = fr(fr(d2 * ((v >> 4) | (((hb >> s2) & 1) << 4))) - m2);
      }
      yo += 64;
    }
  }
}

function rowQ6_K(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 210) {
    const d = h(b, o + 208);
    for (let half = 0; half < 2; half++) {
      const ql = o + 64 * half;
      const qh = o + 128 + 32 * half;
      const sc = o + 192 + 8 * half; // int8 scales
      for (let l = 0; l < 32; l++) {
        const is = l >> 4;
        const hb = b[qh + l]!;
        const q1 = ((b[ql + l]! & 0x0f) | ((hb & 3) << 4)) - 32;
        const q2 = ((b[ql + l + 32]! & 0x0f) | (((hb >> 2) & 3) << 4)) - 32;
        const q3 = ((b[ql + l]! >> 4) | (((hb >> 4) & 3) << 4)) - 32;
        const q4 = ((b[ql + l + 32]! >> 4) | (((hb >> 6) & 3) << 4)) - 32;
        y[yo + l] = fr(fr(d * ((b[sc + is]! << 24) >> 24)) * q1);
        y[yo + l + 32] = fr(fr(d * ((b[sc + is + 2]! << 24) >> 24)) * q2);
        y[yo + l + 64] = fr(fr(d * ((b[sc + is + 4]! << 24) >> 24)) * q3);
        y[yo + l + 96] = fr(fr(d * ((b[sc + is + 6]! << 24) >> 24)) * q4);
      }
      yo += 128;
    }
  }
}

function rowIQ4_NL(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 18, yo += 32) {
    const d = h(b, o);
    for (let j = 0; j < 16; j++) {
      const q = b[o + 2 + j]!;
      y[yo + j] = fr(d * IQ4_NL_VALUES[q & 0x0f]!);
      y[yo + j + 16] = fr(d * IQ4_NL_VALUES[q >> 4]!);
    }
  }
}

function rowIQ4_XS(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 136) {
    const d = h(b, o);
    const scalesH = b[o + 2]! | (b[o + 3]! << 8);
    for (let ib = 0; ib < 8; ib++, yo += 32) {
      const ls = ((b[o + 4 + (ib >> 1)]! >> (4 * (ib % 2))) & 0xf) | (((scalesH >> (2 * ib)) & 3) << 4);
      const dl = fr(d * (ls - 32));
      const qs = o + 8 + 16 * ib;
      for (let j = 0; j < 16; j++) {
        const q = b[qs + j]!;
        y[yo + j] = fr(dl * IQ4_NL_VALUES[q & 0x0f]!);
        y[yo + j + 16] = fr(dl * IQ4_NL_VALUES[q >> 4]!);
      }
    }
  }
}

function rowMXFP4(b: Uint8Array, o: number, nb: number, y: Float32Array, yo: number): void {
  for (let i = 0; i < nb; i++, o += 17, yo += 32) {
    const d = e8m0Half(b[o]!);
    for (let j = 0; j < 16; j++) {
      const q = b[o + 1 + j]!;
      y[yo + j] = fr(MXFP4_VALUES[q & 0x0f]! * d);
      y[yo + j + 16] = fr(MXFP4_VALUES[q >> 4]! * d);
    }
  }
}

const ROW_FNS: Partial<Record<GgmlType, RowFn>> = {
  [GgmlType.F32]: rowF32,
  [GgmlType.F16]: rowF16,
  [GgmlType.BF16]: rowBF16,
  [GgmlType.Q4_0]: rowQ4_0,
  [GgmlType.Q4_1]: rowQ4_1,
  [GgmlType.Q5_0]: rowQ5_0,
  [GgmlType.Q5_1]: rowQ5_1,
  [GgmlType.Q8_0]: rowQ8_0,
  [GgmlType.Q2_K]: rowQ2_K,
  [GgmlType.Q3_K]: rowQ3_K,
  [GgmlType.Q4_K]: rowQ4_K,
  [GgmlType.Q5_K]: rowQ5_K,
  [GgmlType.Q6_K]: rowQ6_K,
  [GgmlType.IQ4_NL]: rowIQ4_NL,
  [GgmlType.IQ4_XS]: rowIQ4_XS,
  [GgmlType.MXFP4]: rowMXFP4,
};

export function canDequantize(type: GgmlType): boolean {
  return ROW_FNS[type] !== undefined;
}

/**
 * Dequantises `nElements` (a whole number of blocks) starting at `bytes[byteOffset]` into
 * `out[outOffset ..]`. Use it for one row of a matrix at a time: a row of ne0 elements of
 * type T starts at byte `row * (ne0 / blockSize) * typeSize`.
 */
export function dequantizeRow(
  type: GgmlType,
  bytes: Uint8Array,
  byteOffset: number,
  nElements: number,
  out: Float32Array,
  outOffset = 0,
): void {
  const fn = ROW_FNS[type];
  const traits = TYPE_TRAITS[type];
  if (!fn || !traits) {
    throw new MeshError('UNSUPPORTED_TENSOR_TYPE', `cannot dequantise tensor type ${typeName(type)} (supported: ${DEQUANT_TYPES.map(typeName).join(', ')})`);
  }
  if (nElements % traits.blockSize !== 0) {
    throw new MeshError('BAD_TENSOR_SIZE', `${nElements} elements is not a whole number of ${traits.name} blocks of ${traits.blockSize}`);
  }
  const nBlocks = nElements / traits.blockSize;
  if (byteOffset + nBlocks * traits.typeSize > bytes.length) {
    throw new MeshError('BAD_TENSOR_SIZE', `${nElements} ${traits.name} elements need ${nBlocks * traits.typeSize} bytes from ${byteOffset}, have ${bytes.length - byteOffset}`);
  }
  if (outOffset + nElements > out.length) {
    throw new MeshError('BAD_TENSOR_SIZE', `output has room for ${out.length - outOffset} of ${nElements} elements`);
  }
  // F32/F16/BF16 blocks are single elements
  fn(bytes, byteOffset, traits.blockSize === 1 ? nElements : nBlocks, out, outOffset);
}

/** Dequantises a whole tensor's bytes. */
export function dequantize(type: GgmlType, bytes: Uint8Array, nElements: number): Float32Array {
  const out = new Float32Array(nElements); // [nElements] f32
  dequantizeRow(type, bytes, 0, nElements, out, 0);
  return out;
}
