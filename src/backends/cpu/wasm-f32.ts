// WebAssembly SIMD kernels for f32 matrices: y[t, r] = Σ_i x[t, i] · w[r, i].
//
// Tile over T tokens (1 or 2) × 4 weight rows, f32x4 lanes:
//   (param x_0..T, w, ws, nIn, y_0..T)          ;; byte pointers, ws = bytes per weight row, nIn in floats (multiple of 4)
//   loop i over nIn·4 bytes by 16:
//     x_t = v128.load(x_t + i)
//     per row r: wv = v128.load(w + r·ws + i); acc[t][r] += x_t · wv
//   y_t[r] = hsum(acc[t][r])
// Every output accumulates in its own lane set in the same order whatever T is, so a token's
// result does not depend on the batch it came in (chunked prefill equals one-shot, bit for bit).
// Where relaxed SIMD validates, acc += x·w is one f32x4.relaxed_madd (an FMA on x86 and ARM:
// one rounding instead of two, still within f32 rounding of the reference).
//
// `mm_f32(x, xs, w, ws, y, ys, nIn, nTok, r0, r1)` runs rows [r0, r1) (a multiple of 4 apart)
// for every token (./wasm-driver.ts): x[t] at x + t·xs, y[t] at y + t·ys. Attention uses it too
// (`attn`, ./wasm-attention.ts): scores are K·q (rows = positions), the weighted sum Vᵀ·p (rows =
// head dimensions).

import { FnBuilder, I32, V128, hsum, kernelModuleBytes, lazyModule, op, relaxedSimdAvailable } from './wasm-asm.ts';
import { attnBody, softmaxBody } from './wasm-attention.ts';
import { driverBody } from './wasm-driver.ts';
import { swigluBody } from './wasm-elementwise.ts';

export function tileBody(T: number, fma: boolean): number[] {
  const x = Array.from({ length: T }, (_, t) => t);
  const w = T, ws = T + 1, nIn = T + 2;
  const y = Array.from({ length: T }, (_, t) => T + 3 + t);
  const b = new FnBuilder(2 * T + 3);
  const rowBytes = b.local(I32), i = b.local(I32);
  const wRow = [w, b.local(I32), b.local(I32), b.local(I32)];
  const xv = b.locals(V128, T);
  const wv = b.local(V128);
  const acc = Array.from({ length: T }, () => b.locals(V128, 4));
  b.emit(op.get(nIn), op.i32Const(2), op.i32Shl, op.set(rowBytes));
  for (let r = 1; r < 4; r++) b.emit(op.get(wRow[r - 1]!), op.get(ws), op.i32Add, op.set(wRow[r]!));
  b.emit(op.loop);
  for (let t = 0; t < T; t++) b.emit(op.get(x[t]!), op.get(i), op.i32Add, op.v128Load(), op.set(xv[t]!));
  for (let r = 0; r < 4; r++) {
    b.emit(op.get(wRow[r]!), op.get(i), op.i32Add, op.v128Load(), op.set(wv));
    for (let t = 0; t < T; t++) {
      if (fma) b.emit(op.get(xv[t]!), op.get(wv), op.get(acc[t]![r]!), op.f32x4RelaxedMadd, op.set(acc[t]![r]!));
      else b.emit(op.get(acc[t]![r]!), op.get(xv[t]!), op.get(wv), op.f32x4Mul, op.f32x4Add, op.set(acc[t]![r]!));
    }
  }
  b.inc(i, 16);
  b.emit(op.get(i), op.get(rowBytes), op.i32LtS, op.brIf(0), op.end);
  for (let t = 0; t < T; t++) {
    for (let r = 0; r < 4; r++) b.emit(op.get(y[t]!), hsum(acc[t]![r]!), op.f32Store(4 * r));
  }
  return b.body();
}

/** function indices in the module */
const TILE2 = 0, TILE1 = 1, MM = 2, SOFTMAX = 3;

function moduleBytes(shared: boolean): Uint8Array<ArrayBuffer> {
  // mm_f32 parameters: x, xs, w, ws, y, ys, nIn, nTok, r0, r1
  const mm = driverBody({
    params: 10,
    streams: [{ base: 0, stride: 1 }],
    out: { base: 4, stride: 5 },
    nTok: 7,
    rowStart: 8,
    rowEnd: 9,
    // w + r·ws, ws, nIn
    weightArgs: (_b, r) => [op.get(2), op.get(r), op.get(3), op.i32Mul, op.i32Add, op.get(3), op.get(6)],
    tiles: [{ T: 2, fn: TILE2 }, { T: 1, fn: TILE1 }],
  });
  // fused multiply-adds where relaxed SIMD is there (about a third fewer instructions per tile)
  const fma = relaxedSimdAvailable();
  return kernelModuleBytes(
    [
      { params: 7, body: tileBody(2, fma) },
      { params: 5, body: tileBody(1, fma) },
      { name: 'mm_f32', params: 10, body: mm },
      { name: 'softmax_rows', params: 6, body: softmaxBody(fma) },
      { name: 'attn', params: 14, body: attnBody(MM, SOFTMAX) },
      { name: 'swiglu', params: 3, body: swigluBody(fma) },
    ],
    shared,
  );
}

/** the compiled f32 kernels for a shared or an unshared memory, or null where WebAssembly SIMD is unavailable */
export const f32KernelModule = lazyModule(moduleBytes);

/** one attention unit (./wasm-attention.ts) */
export type Attn = (q: number, qs: number, k: number, v: number, cap: number, hd: number, l4: number, rows: number, first: number, step: number, scale: number, out: number, os: number, s: number) => void;

export type MmF32 = (x: number, xs: number, w: number, ws: number, y: number, ys: number, nIn: number, nTok: number, r0: number, r1: number) => void;
