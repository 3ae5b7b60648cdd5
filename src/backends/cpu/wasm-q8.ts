// WebAssembly SIMD kernels for weights stored as 8-bit integers with one f32 scale per block
// of 32 (Q8_0 as stored, Q4_0 widened to 8 bits): a quarter of the memory traffic of f32
// weights. Activations come quantised the same way (as ggml does for these types), so each
// block is an exact integer dot product (i32x4.dot_i16x8_s) times the two scales:
//
//   y[t, r] = Σ_b dx[t, b] · dw[r, b] · Σ_{j<32} qx[t, 32b + j] · qw[r, 32b + j]
//
// Tile over T tokens (1, 2 or 4) × 4 weight rows:
//   (param xq_0..T, xd_0..T, wq, wd, nIn, y_0..T)        ;; byte pointers; nIn a multiple of 32
//   loop over blocks (i = 32·b bytes, s = 4·b bytes):
//     per token: dx = f32.load(xd+s); x = the block's 32 int8 widened to four i16x8
//     per row r: w = its 32 int8 widened; sw = f32.load(wd_r+s)
//       per token: acc[t][r] += f32x4(Σ dot_i16x8(x, w)) · splat(sw · dx)
//   y_t[r] = hsum(acc[t][r])
//
// `mm_q8(xq, xqs, xd, xds, wq, wd, y, ys, nIn, nTok, r0, r1)` runs rows [r0, r1) for every
// token (./wasm-driver.ts); weight rows are nIn bytes (wq) and nIn/8 bytes (wd) apart.

import { F32, FnBuilder, I32, V128, hsum, kernelModuleBytes, lazyModule, op } from './wasm-asm.ts';
import { driverBody } from './wasm-driver.ts';

function tileBody(T: 1 | 2 | 4): number[] {
  const xq = Array.from({ length: T }, (_, t) => t);
  const xd = Array.from({ length: T }, (_, t) => T + t);
  const wq = 2 * T, wd = wq + 1, nIn = wd + 1;
  const y = Array.from({ length: T }, (_, t) => nIn + 1 + t);
  const b = new FnBuilder(3 * T + 3);
  const rowScale = b.local(I32), i = b.local(I32), s = b.local(I32);
  const wqRow = [wq, b.local(I32), b.local(I32), b.local(I32)];
  const wdRow = [wd, b.local(I32), b.local(I32), b.local(I32)];
  const xv = Array.from({ length: T }, () => b.locals(V128, 4)); // lo/hi of bytes 0..15, lo/hi of 16..31
  const wv = b.locals(V128, 4);
  const raw = b.local(V128);
  const acc = Array.from({ length: T }, () => b.locals(V128, 4));
  const dx = b.locals(F32, T);
  const sw = b.local(F32);
  // widen 32 int8 at (base + i) into four i16x8 locals
  const widen = (base: number, into: number[]) => {
    b.emit(op.get(base), op.get(i), op.i32Add, op.v128Load(0), op.set(raw));
    b.emit(op.get(raw), op.i16x8ExtendLowI8x16S, op.set(into[0]!), op.get(raw), op.i16x8ExtendHighI8x16S, op.set(into[1]!));
    b.emit(op.get(base), op.get(i), op.i32Add, op.v128Load(16), op.set(raw));
    b.emit(op.get(raw), op.i16x8ExtendLowI8x16S, op.set(into[2]!), op.get(raw), op.i16x8ExtendHighI8x16S, op.set(into[3]!));
  };

  b.emit(op.get(nIn), op.i32Const(3), op.i32ShrU, op.set(rowScale));
  for (let r = 1; r < 4; r++) {
    b.emit(op.get(wqRow[r - 1]!), op.get(nIn), op.i32Add, op.set(wqRow[r]!));
    b.emit(op.get(wdRow[r - 1]!), op.get(rowScale), op.i32Add, op.set(wdRow[r]!));
  }
  b.emit(op.loop);
  for (let t = 0; t < T; t++) {
    b.emit(op.get(xd[t]!), op.get(s), op.i32Add, op.f32Load(), op.set(dx[t]!));
    widen(xq[t]!, xv[t]!);
  }
  for (let r = 0; r < 4; r++) {
    widen(wqRow[r]!, wv);
    b.emit(op.get(wdRow[r]!), op.get(s), op.i32Add, op.f32Load(), op.set(sw));
    for (let t = 0; t < T; t++) {
      const x = xv[t]!;
      b.emit(op.get(x[0]!), op.get(wv[0]!), op.i32x4DotI16x8S);
      for (let k = 1; k < 4; k++) b.emit(op.get(x[k]!), op.get(wv[k]!), op.i32x4DotI16x8S, op.i32x4Add);
      b.emit(op.f32x4ConvertI32x4S, op.get(sw), op.get(dx[t]!), op.f32Mul, op.f32x4Splat, op.f32x4Mul);
      b.emit(op.get(acc[t]![r]!), op.f32x4Add, op.set(acc[t]![r]!));
    }
  }
  b.inc(i, 32).inc(s, 4);
  b.emit(op.get(i), op.get(nIn), op.i32LtS, op.brIf(0), op.end);
  for (let t = 0; t < T; t++) {
    for (let r = 0; r < 4; r++) b.emit(op.get(y[t]!), hsum(acc[t]![r]!), op.f32Store(4 * r));
  }
  return b.body();
}

/** function indices in the module */
const TILE4 = 0, TILE2 = 1, TILE1 = 2;

function moduleBytes(shared: boolean): Uint8Array<ArrayBuffer> {
  // mm_q8 parameters: xq, xqs, xd, xds, wq, wd, y, ys, nIn, nTok, r0, r1
  const mm = driverBody({
    params: 12,
    streams: [{ base: 0, stride: 1 }, { base: 2, stride: 3 }],
    out: { base: 6, stride: 7 },
    nTok: 9,
    rowStart: 10,
    rowEnd: 11,
    // wq + r·nIn, wd + r·nIn/8, nIn
    weightArgs: (_b, r) => [
      op.get(4), op.get(r), op.get(8), op.i32Mul, op.i32Add,
      op.get(5), op.get(r), op.get(8), op.i32Const(3), op.i32ShrU, op.i32Mul, op.i32Add,
      op.get(8),
    ],
    tiles: [{ T: 4, fn: TILE4 }, { T: 2, fn: TILE2 }, { T: 1, fn: TILE1 }],
  });
  return kernelModuleBytes(
    [
      { params: 15, body: tileBody(4) },
      { params: 9, body: tileBody(2) },
      { params: 6, body: tileBody(1) },
      { name: 'mm_q8', params: 12, body: mm },
    ],
    shared,
  );
}

/** the compiled int8 kernels for a shared or an unshared memory, or null where they cannot be compiled */
export const q8KernelModule = lazyModule(moduleBytes);

export type MmQ8 = (xq: number, xqs: number, xd: number, xds: number, wq: number, wd: number, y: number, ys: number, nIn: number, nTok: number, r0: number, r1: number) => void;

/** compiles the module and returns the error, for tests */
export function q8KernelError(): string | null {
  try {
    new WebAssembly.Module(moduleBytes(false));
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}
