// WebAssembly SIMD kernels for weights stored as 8-bit integers with one f32 scale per block
// of 32 (Q8_0 as stored, Q4_0 widened to 8 bits): a quarter of the memory traffic of f32
// weights. Activations come quantised the same way (as ggml does for these types), so each
// block is an exact integer dot product times the two scales:
//
//   y[t, r] = Σ_b dx[t, b] · dw[r, b] · Σ_{j<32} qx[t, 32b + j] · qw[r, 32b + j]
//
// Weights are repacked at load four rows at a time (Q8x4), so the four rows of a block are one
// stream and their scales one vector:
//
//   group g (rows 4g … 4g+3), block b: 144 bytes at w + (g·nb + b)·144
//     [32 int8 of row 4g][… 4g+1][… 4g+2][… 4g+3][f32 scale × 4]
//
// Activations come as i16 (the Q8_0 integers, widened once per matmul instead of once per row
// group). Tile over one token × 4 rows, per block:
//   x = the token's 32 integers as four i16x8 (plain loads)
//   per row r: s_r = Σ_k i32x4.dot_i16x8_s(x_k, w_rk)        (exact integers; w by v128.load8x8_s)
//   S = [hsum s_0, hsum s_1, hsum s_2, hsum s_3]              (a 4 × 4 transpose-add)
//   acc += f32x4(S) · (dw[4 rows] · dx)                       (fused where relaxed SIMD is there)
//   y[t, 4g … 4g+3] = acc                                     (one store)
// Every token runs the same arithmetic, so a token's result does not depend on its batch.
//
// Each block also reads one word of each cache line Q8_READ_AHEAD bytes on. WebAssembly has no
// prefetch, and one thread streaming weights from DRAM keeps too few lines in flight while the
// core works through a block's ~90 instructions: touching them early took a 150 MB mat-vec from
// ~6.5 to ~10.5 GB/s here (the loaded words are dropped; an engine keeps a load that may trap).
// Matrices are allocated with that many bytes to spare (q8x4Bytes). V8 emits a wasm function's
// loads in program order before the arithmetic that uses them, so the row pointers are i32 adds
// (every load8x8_s shares the offsets 0, 8, 16, 24) to keep fewer registers live.
//
// `mm_q8(xq, xqs, xd, xds, w, y, ys, nIn, nTok, r0, r1)` runs rows [r0, r1) (a multiple of 4
// apart, from a multiple of 4) for every token (./wasm-driver.ts); xq: i16, xqs in bytes.

import { FnBuilder, I32, V128, kernelModuleBytes, lanes32, lazyModule, op, relaxedSimdAvailable } from './wasm-asm.ts';
import { driverBody } from './wasm-driver.ts';

/** bytes of one 4-row group of one block: 4 × 32 int8 + 4 f32 scales */
export const Q8X4_BLOCK_BYTES = 144;

/** i32x4 a, b on the stack → [a0 + a2, b0 + b2, a1 + a3, b1 + b3] */
function pairAdd(b: FnBuilder, x: number, y: number): void {
  b.emit(op.get(x), op.get(y), op.shuffle(lanes32(0, 4, 1, 5)), op.get(x), op.get(y), op.shuffle(lanes32(2, 6, 3, 7)), op.i32x4Add);
}

/** bytes past a matrix's last block that the kernel's read-ahead may touch */
export const Q8_READ_AHEAD = 576;

/** arena bytes for a [rows × cols] matrix in the Q8x4 layout, read-ahead included */
export function q8x4Bytes(rows: number, cols: number): number {
  return (rows * cols * 9) / 8 + Q8_READ_AHEAD + Q8X4_BLOCK_BYTES;
}

function tileBody(fma: boolean): number[] {
  // parameters: xq (i16), xd, w (the group's first block), nIn, y
  const xq = 0, xd = 1, w = 2, nIn = 3, y = 4;
  const b = new FnBuilder(5);
  const i = b.local(I32), s4 = b.local(I32), end = b.local(I32), xi = b.local(I32);
  const wr = [b.local(I32), b.local(I32), b.local(I32), b.local(I32)];
  const x = b.locals(V128, 4);
  const wv = b.locals(V128, 4);
  const sums = b.locals(V128, 4);
  const t01 = b.local(V128), t23 = b.local(V128), acc = b.local(V128);
  const wb = wr[0]!;
  b.emit(op.get(w), op.set(wb), op.get(nIn), op.i32Const(1), op.i32Shl, op.set(end));
  b.emit(op.loop);
  // the read-ahead: one word per cache line of the block Q8_READ_AHEAD bytes on
  for (const o of [0, 64, 128]) b.emit(op.get(wb), op.i32Load(Q8_READ_AHEAD + o), op.drop);
  for (let r = 1; r < 4; r++) b.emit(op.get(wb), op.i32Const(32 * r), op.i32Add, op.set(wr[r]!));
  b.emit(op.get(xq), op.get(i), op.i32Add, op.set(xi));
  for (let k = 0; k < 4; k++) b.emit(op.get(xi), op.v128Load(16 * k), op.set(x[k]!));
  for (let r = 0; r < 4; r++) {
    for (let k = 0; k < 4; k++) b.emit(op.get(wr[r]!), op.v128Load8x8S(8 * k), op.set(wv[k]!));
    for (let k = 0; k < 4; k++) {
      b.emit(op.get(x[k]!), op.get(wv[k]!), op.i32x4DotI16x8S);
      if (k > 0) b.emit(op.i32x4Add);
    }
    b.emit(op.set(sums[r]!));
  }
  // [hsum s0, hsum s1, hsum s2, hsum s3]
  pairAdd(b, sums[0]!, sums[1]!);
  b.emit(op.set(t01));
  pairAdd(b, sums[2]!, sums[3]!);
  b.emit(op.set(t23));
  b.emit(op.get(t01), op.get(t23), op.shuffle(lanes32(0, 1, 4, 5)), op.get(t01), op.get(t23), op.shuffle(lanes32(2, 3, 6, 7)), op.i32x4Add);
  // acc += f32(S) · dw4 · dx
  b.emit(op.f32x4ConvertI32x4S, op.get(wb), op.v128Load(128), op.get(xd), op.get(s4), op.i32Add, op.f32Load(), op.f32x4Splat, op.f32x4Mul);
  if (fma) b.emit(op.get(acc), op.f32x4RelaxedMadd, op.set(acc));
  else b.emit(op.f32x4Mul, op.get(acc), op.f32x4Add, op.set(acc));
  b.inc(i, 64).inc(s4, 4).inc(wb, Q8X4_BLOCK_BYTES);
  b.emit(op.get(i), op.get(end), op.i32LtS, op.brIf(0), op.end);
  b.emit(op.get(y), op.get(acc), op.v128Store());
  return b.body();
}

const TILE = 0;

function moduleBytes(shared: boolean): Uint8Array<ArrayBuffer> {
  // mm_q8 parameters: xq, xqs, xd, xds, w, y, ys, nIn, nTok, r0, r1
  const mm = driverBody({
    params: 11,
    streams: [{ base: 0, stride: 1 }, { base: 2, stride: 3 }],
    out: { base: 5, stride: 6 },
    nTok: 8,
    rowStart: 9,
    rowEnd: 10,
    // the row group's first block: w + (r/4)·(nIn/32)·144 = w + (r·nIn/8)·9; then nIn
    weightArgs: (_b, r) => [op.get(4), op.get(r), op.get(7), op.i32Mul, op.i32Const(3), op.i32ShrU, op.i32Const(9), op.i32Mul, op.i32Add, op.get(7)],
    tiles: [{ T: 1, fn: TILE }],
  });
  return kernelModuleBytes(
    [
      { params: 5, body: tileBody(relaxedSimdAvailable()) },
      { name: 'mm_q8', params: 11, body: mm },
    ],
    shared,
  );
}

/** the compiled int8 kernels for a shared or an unshared memory, or null where they cannot be compiled */
export const q8KernelModule = lazyModule(moduleBytes);

export type MmQ8 = (xq: number, xqs: number, xd: number, xds: number, w: number, y: number, ys: number, nIn: number, nTok: number, r0: number, r1: number) => void;

/** compiles the module and returns the error, for tests */
export function q8KernelError(): string | null {
  try {
    new WebAssembly.Module(moduleBytes(false));
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}
