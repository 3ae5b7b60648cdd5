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
// From WIDEN_FROM tokens on (prefill, batches), each row group is first widened to i16 into the
// call's scratch, and every token multiplies that with plain loads: the widening shuffle of
// load8x8_s runs on one port on x86 and bounds the tile; widened once per group it took the
// 128-token prefill of the synthetic 250M model from ~100 to ~120 tok/s. Same integers, same bits.
//
// `mm_q8(xq, xqs, xd, xds, w, y, ys, nIn, nTok, r0, r1, scratch)` runs rows [r0, r1) (a multiple
// of 4 apart, from a multiple of 4) for every token; xq: i16, xqs in bytes; scratch: q8Scratch bytes.

import { F32, FnBuilder, I32, V128, kernelModuleBytes, lanes32, lazyModule, op, relaxedSimdAvailable } from './wasm-asm.ts';

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

/** bytes of one block widened for a batch: 4 × 32 i16, then the 4 f32 scales */
const WIDE_BLOCK_BYTES = 272;

/** scratch bytes one mm_q8 call needs for nTok tokens of nIn (one row group's weights widened) */
export function q8Scratch(nIn: number, nTok: number): number {
  return nTok >= WIDEN_FROM ? (nIn / 32) * WIDE_BLOCK_BYTES : 0;
}

/** tokens from which a row group's weights are widened to i16 once (into the call's scratch) for all of them */
const WIDEN_FROM = 4;

/** acc += f32([hsum s0, hsum s1, hsum s2, hsum s3]) · dw4 · dx, dw4 at `scales` + `at`, dx at xd + s4 */
function reduceAndScale(b: FnBuilder, sums: number[], t01: number, t23: number, scales: number, at: number, xd: number, s4: number, acc: number, fma: boolean): void {
  pairAdd(b, sums[0]!, sums[1]!);
  b.emit(op.set(t01));
  pairAdd(b, sums[2]!, sums[3]!);
  b.emit(op.set(t23));
  b.emit(op.get(t01), op.get(t23), op.shuffle(lanes32(0, 1, 4, 5)), op.get(t01), op.get(t23), op.shuffle(lanes32(2, 3, 6, 7)), op.i32x4Add);
  b.emit(op.f32x4ConvertI32x4S, op.get(scales), op.v128Load(at), op.get(xd), op.get(s4), op.i32Add, op.f32Load(), op.f32x4Splat, op.f32x4Mul);
  if (fma) b.emit(op.get(acc), op.f32x4RelaxedMadd, op.set(acc));
  else b.emit(op.f32x4Mul, op.get(acc), op.f32x4Add, op.set(acc));
}

/** the read-ahead: one word per cache line of the block Q8_READ_AHEAD bytes past `wb` */
function readAhead(b: FnBuilder, wb: number): void {
  for (const o of [0, 64, 128]) b.emit(op.get(wb), op.i32Load(Q8_READ_AHEAD + o), op.drop);
}

/** one token × 4 rows over the Q8x4 blocks (weights streamed: read-ahead) */
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
  readAhead(b, wb);
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
  reduceAndScale(b, sums, t01, t23, wb, 128, xd, s4, acc, fma);
  b.inc(i, 64).inc(s4, 4).inc(wb, Q8X4_BLOCK_BYTES);
  b.emit(op.get(i), op.get(end), op.i32LtS, op.brIf(0), op.end);
  b.emit(op.get(y), op.get(acc), op.v128Store());
  return b.body();
}

/**
 * One token × 4 rows over weights widened to i16 (WIDE_BLOCK_BYTES blocks): plain loads instead
 * of load8x8_s, whose widening shuffle bounds the int8 tile (one port on x86). The same integers
 * and float operations as tileBody, so the same bits. A store of rows 0–1's partial result
 * (overwritten at the end) splits the loads in two, as V8 emits them all first otherwise.
 */
function wideTileBody(fma: boolean): number[] {
  const xq = 0, xd = 1, w = 2, nIn = 3, y = 4;
  const b = new FnBuilder(5);
  const i = b.local(I32), s4 = b.local(I32), wb = b.local(I32), end = b.local(I32), xi = b.local(I32);
  const x = b.locals(V128, 4);
  const sums = b.locals(V128, 4);
  const t01 = b.local(V128), t23 = b.local(V128), acc = b.local(V128);
  const loadX = () => {
    for (let k = 0; k < 4; k++) b.emit(op.get(xi), op.v128Load(16 * k), op.set(x[k]!));
  };
  b.emit(op.get(w), op.set(wb), op.get(nIn), op.i32Const(1), op.i32Shl, op.set(end));
  b.emit(op.loop);
  b.emit(op.get(xq), op.get(i), op.i32Add, op.set(xi));
  loadX();
  for (let r = 0; r < 4; r++) {
    for (let k = 0; k < 4; k++) {
      b.emit(op.get(x[k]!), op.get(wb), op.v128Load(64 * r + 16 * k), op.i32x4DotI16x8S);
      if (k > 0) b.emit(op.i32x4Add);
    }
    b.emit(op.set(sums[r]!));
    if (r === 1) {
      b.emit(op.get(y), op.get(sums[0]!), op.get(sums[1]!), op.i32x4Add, op.v128Store());
      loadX();
    }
  }
  reduceAndScale(b, sums, t01, t23, wb, 256, xd, s4, acc, fma);
  b.inc(i, 64).inc(s4, 4).inc(wb, WIDE_BLOCK_BYTES);
  b.emit(op.get(i), op.get(end), op.i32LtS, op.brIf(0), op.end);
  b.emit(op.get(y), op.get(acc), op.v128Store());
  return b.body();
}

/** widen(w, nIn, out): a row group's Q8x4 blocks → WIDE_BLOCK_BYTES blocks at out */
function widenBody(): number[] {
  const w = 0, nIn = 1, out = 2;
  const b = new FnBuilder(3);
  const wb = b.local(I32), ob = b.local(I32), end = b.local(I32);
  b.emit(op.get(w), op.set(wb), op.get(out), op.set(ob));
  // end = w + nIn/32 · 144
  b.emit(op.get(w), op.get(nIn), op.i32Const(5), op.i32ShrU, op.i32Const(Q8X4_BLOCK_BYTES), op.i32Mul, op.i32Add, op.set(end));
  b.emit(op.loop);
  readAhead(b, wb);
  for (let k = 0; k < 16; k++) b.emit(op.get(ob), op.get(wb), op.v128Load8x8S(8 * k), op.v128Store(16 * k));
  b.emit(op.get(ob), op.get(wb), op.v128Load(128), op.v128Store(256));
  b.inc(wb, Q8X4_BLOCK_BYTES).inc(ob, WIDE_BLOCK_BYTES);
  b.emit(op.get(wb), op.get(end), op.i32LtU, op.brIf(0), op.end);
  return b.body();
}

/**
 * quant_q8(x, nBlocks, q, d): f32 activations → Q8_0 as ggml rounds them, the same bits as
 * quantizeRowsQ8_0 (./act-round.ts): d = f16(amax/127) as f32, q = roundeven(x · f32(127/amax))
 * as i16. The f16 rounding in f32 arithmetic: subnormal halves by adding and taking away 0.5
 * (whose ulp is the smallest half), normal ones by rounding the mantissa to 10 bits, from 65520 Inf.
 */
function quantBody(): number[] {
  const x = 0, nBlocks = 1, q = 2, d = 3;
  const b = new FnBuilder(4);
  const end = b.local(I32), bits = b.local(I32);
  const amax = b.local(F32), dv = b.local(F32);
  const v = b.locals(V128, 8);
  const m = b.local(V128), id = b.local(V128);
  b.emit(op.get(x), op.get(nBlocks), op.i32Const(7), op.i32Shl, op.i32Add, op.set(end));
  b.emit(op.block, op.loop, op.get(x), op.get(end), op.i32GeU, op.brIf(1));
  for (let k = 0; k < 8; k++) b.emit(op.get(x), op.v128Load(16 * k), op.set(v[k]!));
  b.emit(op.get(v[0]!), op.f32x4Abs);
  for (let k = 1; k < 8; k++) b.emit(op.get(v[k]!), op.f32x4Abs, op.f32x4Max);
  b.emit(op.set(m));
  b.emit(op.get(m), op.get(m), op.get(m), op.shuffle(lanes32(2, 3, 0, 1)), op.f32x4Max, op.set(m));
  b.emit(op.get(m), op.get(m), op.get(m), op.shuffle(lanes32(1, 0, 3, 2)), op.f32x4Max, op.extract(0), op.set(amax));
  // d = f16(amax / 127)
  b.emit(op.get(amax), op.f32Const(127), op.f32Div, op.set(dv));
  b.emit(op.get(dv), op.f32Const(65520), op.f32Ge, op.if, op.f32Const(Infinity), op.set(dv), op.else);
  b.emit(op.get(dv), op.f32Const(2 ** -14), op.f32Lt, op.if, op.get(dv), op.f32Const(0.5), op.f32Add, op.f32Const(0.5), op.f32Sub, op.set(dv), op.else);
  b.emit(op.get(dv), op.i32ReinterpretF32, op.tee(bits), op.i32Const(0xfff), op.i32Add, op.get(bits), op.i32Const(13), op.i32ShrU, op.i32Const(1), op.i32And, op.i32Add);
  b.emit(op.i32Const(~0x1fff), op.i32And, op.f32ReinterpretI32, op.set(dv), op.end, op.end);
  b.emit(op.get(d), op.get(dv), op.f32Store());
  // id = amax ≠ 0 ? 127 / amax : 0; q = roundeven(x · id)
  b.emit(op.f32Const(127), op.get(amax), op.f32Div, op.f32Const(0), op.get(amax), op.f32Const(0), op.f32Ne, op.select, op.f32x4Splat, op.set(id));
  for (let k = 0; k < 8; k += 2) {
    b.emit(op.get(q));
    for (const j of [k, k + 1]) b.emit(op.get(v[j]!), op.get(id), op.f32x4Mul, op.f32x4Nearest, op.i32x4TruncSatF32x4S);
    b.emit(op.i16x8NarrowI32x4S, op.v128Store(8 * k));
  }
  b.inc(x, 128).inc(q, 64).inc(d, 4);
  b.emit(op.br(0), op.end, op.end);
  return b.body();
}

const TILE = 0, WIDE_TILE = 1, WIDEN = 2;

/**
 * mm_q8(xq, xqs, xd, xds, w, y, ys, nIn, nTok, r0, r1, scratch): per row group, every token on
 * the streamed weights, or (from WIDEN_FROM tokens) the group widened into scratch once and every
 * token on that.
 */
function mmBody(): number[] {
  const xq = 0, xqs = 1, xd = 2, xds = 3, w = 4, y = 5, ys = 6, nIn = 7, nTok = 8, r0 = 9, r1 = 10, scratch = 11;
  const b = new FnBuilder(12);
  const r = b.local(I32), t = b.local(I32), wg = b.local(I32), wide = b.local(I32);
  const at = (base: number, stride: number) => [op.get(base), op.get(t), op.get(stride), op.i32Mul, op.i32Add];
  b.emit(op.get(nTok), op.i32Const(WIDEN_FROM), op.i32GeS, op.set(wide));
  b.emit(op.get(r0), op.set(r), op.block, op.loop, op.get(r), op.get(r1), op.i32GeS, op.brIf(1));
  // the row group's first block: w + (r/4)·(nIn/32)·144 = w + (r·nIn/8)·9
  b.emit(op.get(w), op.get(r), op.get(nIn), op.i32Mul, op.i32Const(3), op.i32ShrU, op.i32Const(9), op.i32Mul, op.i32Add, op.set(wg));
  b.emit(op.get(wide), op.if, op.get(wg), op.get(nIn), op.get(scratch), op.call(WIDEN), op.get(scratch), op.set(wg), op.end);
  b.emit(op.i32Const(0), op.set(t), op.block, op.loop, op.get(t), op.get(nTok), op.i32GeS, op.brIf(1));
  const args = [...at(xq, xqs), ...at(xd, xds), op.get(wg), op.get(nIn), ...at(y, ys), op.get(r), op.i32Const(2), op.i32Shl, op.i32Add];
  b.emit(op.get(wide), op.if, ...args, op.call(WIDE_TILE), op.else, ...args, op.call(TILE), op.end);
  b.inc(t, 1).emit(op.br(0), op.end, op.end);
  b.inc(r, 4).emit(op.br(0), op.end, op.end);
  return b.body();
}

function moduleBytes(shared: boolean): Uint8Array<ArrayBuffer> {
  const fma = relaxedSimdAvailable();
  return kernelModuleBytes(
    [
      { params: 5, body: tileBody(fma) },
      { params: 5, body: wideTileBody(fma) },
      { params: 3, body: widenBody() },
      { name: 'mm_q8', params: 12, body: mmBody() },
      { name: 'quant_q8', params: 4, body: quantBody() },
    ],
    shared,
  );
}

/** the compiled int8 kernels for a shared or an unshared memory, or null where they cannot be compiled */
export const q8KernelModule = lazyModule(moduleBytes);

/** f32 activations → Q8_0 (i16 integers and f32 scales), nBlocks blocks of 32 */
export type QuantQ8 = (x: number, nBlocks: number, q: number, d: number) => void;

export type MmQ8 = (xq: number, xqs: number, xd: number, xds: number, w: number, y: number, ys: number, nIn: number, nTok: number, r0: number, r1: number, scratch: number) => void;

/** compiles the module and returns the error, for tests */
export function q8KernelError(): string | null {
  try {
    new WebAssembly.Module(moduleBytes(false));
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}
