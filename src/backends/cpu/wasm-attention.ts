// Attention of one unit (a KV head's query rows) as one WebAssembly call, so a worker thread
// runs scores, softmax and the weighted sum of a head without coming back to JS:
//
//   attn(q, qs, k, v, cap, hd, l4, rows, first, step, scale, out, os, s)
//     s[r, :]   = K · q_r                      mm_f32 over positions [0, l4)
//     p[r, :]   = softmax(s[r, 0 … n_r) · scale), zero past n_r = first + r·step
//     out_r     = Vᵀ · p[r, :]                 mm_f32 over the head's dimensions
//   (byte pointers; qs, os: bytes between rows of q and out; cap, hd, l4 in elements; scale
//   as its f32 bit pattern; s: rows × l4 f32 of scratch)
//
// The softmax runs in f32x4 lanes with exp(x) from Cody–Waite range reduction and Cephes'
// degree-6 polynomial (within 2 ulp of expf, as ggml's own SIMD exp is). Masked lanes are
// exactly zero, so a row's zero tail adds nothing and a token's result does not depend on the
// chunk it came in.

import { F32, FnBuilder, I32, V128, op } from './wasm-asm.ts';

const LOG2E = 1.44269504088896341;
const C1 = 0.693359375; // ln 2, high part (few bits: n·C1 is exact)
const C2 = -2.12194440e-4; // ln 2 − C1
const P = [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1];
const EXP_MIN = -87.33654; // below this e^x leaves f32's normal range
const EXP_MAX = 88.3762626647949; // above it e^x overflows f32

/**
 * emits code leaving exp(x) for the lanes of local x on the stack (n, r: v128 temps); x is
 * clamped to [EXP_MIN, EXP_MAX], so −∞ gives e^EXP_MIN and +∞ the largest finite power.
 */
export function emitExp(b: FnBuilder, x: number, n: number, r: number, fma: boolean): void {
  // r = clamp(x); n = nearest(r · log2 e); r = r − n·C1 − n·C2
  b.emit(op.get(x), op.f32x4Const(EXP_MIN), op.f32x4Max, op.f32x4Const(EXP_MAX), op.f32x4Min, op.set(r));
  b.emit(op.get(r), op.f32x4Const(LOG2E), op.f32x4Mul, op.f32x4Nearest, op.set(n));
  b.emit(op.get(r), op.get(n), op.f32x4Const(C1), op.f32x4Mul, op.f32x4Sub, op.get(n), op.f32x4Const(C2), op.f32x4Mul, op.f32x4Sub, op.set(r));
  // y = ((((P0·r + P1)·r + P2)·r + P3)·r + P4)·r + P5, kept on the stack
  b.emit(op.f32x4Const(P[0]!));
  for (const c of P.slice(1)) {
    if (fma) b.emit(op.get(r), op.f32x4Const(c), op.f32x4RelaxedMadd);
    else b.emit(op.get(r), op.f32x4Mul, op.f32x4Const(c), op.f32x4Add);
  }
  // y·r² + r + 1
  b.emit(op.get(r), op.get(r), op.f32x4Mul);
  if (fma) b.emit(op.get(r), op.f32x4RelaxedMadd);
  else b.emit(op.f32x4Mul, op.get(r), op.f32x4Add);
  b.emit(op.f32x4Const(1), op.f32x4Add);
  // · 2ⁿ, built as the exponent bits (n + 127) << 23 (−126 ≤ n ≤ 127 after the clamp)
  b.emit(op.get(n), op.i32x4TruncSatF32x4S, op.i32x4Const(127), op.i32x4Add, op.i32Const(23), op.i32x4Shl, op.f32x4Mul);
}

/**
 * softmax_rows(s, width, rows, first, step, scale): row r of the [rows × width] f32 at s keeps
 * keys j < first + r·step, scaled, softmaxed; the rest of the row becomes 0. width: a multiple of 4.
 */
export function softmaxBody(fma: boolean): number[] {
  const s = 0, width = 1, rows = 2, first = 3, step = 4, scaleBits = 5;
  const b = new FnBuilder(6);
  const r = b.local(I32), j = b.local(I32), p = b.local(I32), n = b.local(I32);
  const v = b.local(V128), mask = b.local(V128), acc = b.local(V128), t0 = b.local(V128), t1 = b.local(V128), scale = b.local(V128);
  const sum = b.local(F32), inv = b.local(F32);
  const lanes = op.i32x4Const(0, 1, 2, 3);
  // mask of lanes j + k < n
  const maskAt = () => b.emit(op.get(j), op.i32x4Splat, lanes, op.i32x4Add, op.get(n), op.i32x4Splat, op.i32x4LtS, op.set(mask));
  const overRow = (body: () => void) => {
    b.emit(op.i32Const(0), op.set(j), op.block, op.loop, op.get(j), op.get(width), op.i32GeS, op.brIf(1));
    body();
    b.inc(j, 4).emit(op.br(0), op.end, op.end);
  };
  const at = () => [op.get(p), op.get(j), op.i32Const(2), op.i32Shl, op.i32Add];
  b.emit(op.get(scaleBits), op.f32ReinterpretI32, op.f32x4Splat, op.set(scale));
  b.emit(op.i32Const(0), op.set(r), op.block, op.loop, op.get(r), op.get(rows), op.i32GeS, op.brIf(1));
  b.emit(op.get(s), op.get(r), op.get(width), op.i32Mul, op.i32Const(2), op.i32Shl, op.i32Add, op.set(p));
  b.emit(op.get(first), op.get(r), op.get(step), op.i32Mul, op.i32Add, op.set(n));
  // pass 1: v = s · scale (masked lanes −∞), stored; acc = lane-wise max
  b.emit(op.f32x4Const(-Infinity), op.set(acc));
  overRow(() => {
    maskAt();
    b.emit(...at(), ...at(), op.v128Load(), op.get(scale), op.f32x4Mul, op.f32x4Const(-Infinity), op.get(mask), op.v128Bitselect, op.tee(v), op.v128Store());
    b.emit(op.get(acc), op.get(v), op.f32x4Max, op.set(acc));
  });
  // the row's max, splatted
  b.emit(op.get(acc), op.extract(0), op.get(acc), op.extract(1), op.f32Max, op.get(acc), op.extract(2), op.f32Max, op.get(acc), op.extract(3), op.f32Max, op.f32x4Splat, op.set(acc));
  // pass 2: e = exp(v − max), masked lanes exactly 0; t0 = lane-wise sums
  b.emit(op.v128Const0, op.set(t1));
  overRow(() => {
    maskAt();
    b.emit(...at(), op.v128Load(), op.get(acc), op.f32x4Sub, op.set(v));
    b.emit(...at());
    emitExp(b, v, t0, v, fma);
    b.emit(op.get(mask), op.v128And, op.tee(v), op.v128Store(), op.get(t1), op.get(v), op.f32x4Add, op.set(t1));
  });
  // pass 3: · 1/Σ
  b.emit(op.get(t1), op.extract(0), op.get(t1), op.extract(1), op.f32Add, op.get(t1), op.extract(2), op.f32Add, op.get(t1), op.extract(3), op.f32Add, op.set(sum));
  b.emit(op.f32Const(1), op.get(sum), op.f32Div, op.set(inv));
  overRow(() => b.emit(...at(), ...at(), op.v128Load(), op.get(inv), op.f32x4Splat, op.f32x4Mul, op.v128Store()));
  b.inc(r, 1).emit(op.br(0), op.end, op.end);
  return b.body();
}

/** attn(…) as in the header comment, calling mm_f32 (function `mm`) and softmax_rows (`softmax`) */
export function attnBody(mm: number, softmax: number): number[] {
  const [q, qs, k, v, cap, hd, l4, rows, first, step, scale, out, os, s] = Array.from({ length: 14 }, (_, i) => i);
  const b = new FnBuilder(14);
  const four = (x: number) => [op.get(x), op.i32Const(2), op.i32Shl];
  // scores: x = q rows, w = K rows (hd floats each), y = s (l4 floats per row), rows [0, l4)
  b.emit(op.get(q!), op.get(qs!), op.get(k!), ...four(hd!), op.get(s!), ...four(l4!), op.get(hd!), op.get(rows!), op.i32Const(0), op.get(l4!), op.call(mm));
  b.emit(op.get(s!), op.get(l4!), op.get(rows!), op.get(first!), op.get(step!), op.get(scale!), op.call(softmax));
  // weighted sums: x = p rows, w = Vᵀ rows (cap floats apart), y = out rows, rows [0, hd)
  b.emit(op.get(s!), ...four(l4!), op.get(v!), ...four(cap!), op.get(out!), op.get(os!), op.get(l4!), op.get(rows!), op.i32Const(0), op.get(hd!), op.call(mm));
  return b.body();
}
