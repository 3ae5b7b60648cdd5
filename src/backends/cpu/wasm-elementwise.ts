// Elementwise kernels of the forward pass in WebAssembly SIMD, so worker threads share them:
//
//   swiglu(g, u, n): g[i] = silu(g[i]) · u[i] = g[i] / (1 + e^(−g[i])) · u[i]   (n: a multiple of 4)
//
// e^x as in ./wasm-attention.ts (within 2 ulp of expf, as ggml's own SIMD silu is).

import { FnBuilder, I32, V128, op } from './wasm-asm.ts';
import { emitExp } from './wasm-attention.ts';

export function swigluBody(fma: boolean): number[] {
  const g = 0, u = 1, n = 2;
  const b = new FnBuilder(3);
  const i = b.local(I32), end = b.local(I32);
  const x = b.local(V128), t0 = b.local(V128), t1 = b.local(V128);
  b.emit(op.get(n), op.i32Const(2), op.i32Shl, op.set(end));
  b.emit(op.block, op.loop, op.get(i), op.get(end), op.i32GeS, op.brIf(1));
  // address for the store, then −g
  b.emit(op.get(g), op.get(i), op.i32Add);
  b.emit(op.get(g), op.get(i), op.i32Add, op.v128Load(), op.tee(x), op.f32x4Const(-1), op.f32x4Mul, op.set(t1));
  // g / (1 + e^(−g)) · u
  b.emit(op.get(x));
  emitExp(b, t1, t0, t1, fma);
  b.emit(op.f32x4Const(1), op.f32x4Add, op.f32x4Div);
  b.emit(op.get(u), op.get(i), op.i32Add, op.v128Load(), op.f32x4Mul, op.v128Store());
  b.inc(i, 16).emit(op.br(0), op.end, op.end);
  return b.body();
}
