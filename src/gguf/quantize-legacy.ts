// The 32-element block quantisers with a min or a fifth bit, byte-identical with ggml's
// quantize_row_{q4_1,q5_0,q5_1}_ref (every step rounded to f32, as ./quantize.ts explains).
//   Q4_1 (20): f16 d · f16 m · u8 qs[16]               x = d·q + m
//   Q5_0 (22): f16 d · u32 qh · u8 qs[16]              x = d·(q − 16), bit 4 of q in qh
//   Q5_1 (24): f16 d · f16 m · u32 qh · u8 qs[16]      x = d·q + m
// Element j < 16 is the low nibble of qs[j], element j + 16 the high nibble.

import { putF16, signedMax } from './quant-search.ts';

const fr = Math.fround;
const F32_MAX = 3.4028234663852886e38;

/** min and max of one block of 32 values */
function minMax(x: Float32Array, xo: number): [number, number] {
  let min = F32_MAX;
  let max = -F32_MAX;
  for (let j = 0; j < 32; j++) {
    const v = x[xo + j]!;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return [min, max];
}

function putU32(out: Uint8Array, at: number, v: number): void {
  out[at] = v & 0xff;
  out[at + 1] = (v >>> 8) & 0xff;
  out[at + 2] = (v >>> 16) & 0xff;
  out[at + 3] = (v >>> 24) & 0xff;
}

export function quantizeQ4_1(x: Float32Array, out: Uint8Array): void {
  for (let i = 0; i < x.length / 32; i++) {
    const xo = i * 32;
    const o = i * 20;
    const [min, max] = minMax(x, xo);
    const d = fr(fr(max - min) / 15);
    const id = d ? fr(1 / d) : 0;
    putF16(out, o, d);
    putF16(out, o + 2, min);
    for (let j = 0; j < 16; j++) {
      const x0 = fr(fr(x[xo + j]! - min) * id);
      const x1 = fr(fr(x[xo + 16 + j]! - min) * id);
      const q0 = Math.min(15, Math.trunc(fr(x0 + 0.5)));
      const q1 = Math.min(15, Math.trunc(fr(x1 + 0.5)));
      out[o + 4 + j] = q0 | (q1 << 4);
    }
  }
}

export function quantizeQ5_0(x: Float32Array, out: Uint8Array): void {
  for (let i = 0; i < x.length / 32; i++) {
    const xo = i * 32;
    const o = i * 22;
    const max = signedMax(x, xo, 32)[1];
    const d = fr(max / -16);
    const id = d ? fr(1 / d) : 0;
    putF16(out, o, d);
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(31, Math.trunc(fr(fr(x[xo + j]! * id) + 16.5)));
      const q1 = Math.min(31, Math.trunc(fr(fr(x[xo + 16 + j]! * id) + 16.5)));
      out[o + 6 + j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
      qh |= ((q0 & 0x10) >> 4) << j;
      qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    putU32(out, o + 2, qh >>> 0);
  }
}

export function quantizeQ5_1(x: Float32Array, out: Uint8Array): void {
  for (let i = 0; i < x.length / 32; i++) {
    const xo = i * 32;
    const o = i * 24;
    const [min, max] = minMax(x, xo);
    const d = fr(fr(max - min) / 31);
    const id = d ? fr(1 / d) : 0;
    putF16(out, o, d);
    putF16(out, o + 2, min);
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      const q0 = Math.trunc(fr(fr(fr(x[xo + j]! - min) * id) + 0.5)) & 0xff;
      const q1 = Math.trunc(fr(fr(fr(x[xo + 16 + j]! - min) * id) + 0.5)) & 0xff;
      out[o + 8 + j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
      qh |= ((q0 & 0x10) >> 4) << j;
      qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    putU32(out, o + 4, qh >>> 0);
  }
}
