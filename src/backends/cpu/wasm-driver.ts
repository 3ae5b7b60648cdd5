// The loop every CPU matmul kernel shares, assembled into WebAssembly: over groups of four
// output rows, then over the tokens in tiles of T (largest first), calling a tile function
// that multiplies T token rows by the four weight rows. The loop lives in WebAssembly so a
// worker thread runs a whole row range from one call (see ./compute-pool.ts).

import { FnBuilder, op } from './wasm-asm.ts';

export interface TokenStream {
  /** parameter holding the first token's pointer (bytes) */
  base: number;
  /** parameter holding the bytes between consecutive tokens */
  stride: number;
}

export interface DriverSpec {
  /** i32 parameters of the exported function */
  params: number;
  /** per-token inputs, in the order tiles take them (each tile gets T pointers per stream) */
  streams: TokenStream[];
  /** the output: y[t] at out.base + t·out.stride, row r at +4r bytes */
  out: TokenStream;
  nTok: number;
  rowStart: number;
  rowEnd: number;
  /** emits the weight arguments of a tile for the row group starting at row local `r` */
  weightArgs: (b: FnBuilder, r: number) => number[][];
  /** tile sizes, largest first, ending with 1, and their function indices */
  tiles: { T: number; fn: number }[];
}

/**
 * Body of `for (r = r0; r < r1; r += 4) for tiles of tokens: tile(tokens…, weights…, outputs…)`.
 * A tile's arguments: T pointers per stream, the weight arguments, then T output pointers.
 */
export function driverBody(s: DriverSpec): number[] {
  const b = new FnBuilder(s.params);
  const r = b.local(0x7f);
  const t = b.local(0x7f);
  const cur = s.streams.map(() => b.local(0x7f));
  const yCur = b.local(0x7f);
  const ptr = (base: number, stride: number, k: number) => [op.get(base), op.get(stride), op.i32Const(k), op.i32Mul, op.i32Add];

  b.emit(op.get(s.rowStart), op.set(r));
  b.emit(op.block, op.loop);
  b.emit(op.get(r), op.get(s.rowEnd), op.i32GeS, op.brIf(1));
  // the tokens of this row group start again at token 0
  b.emit(op.i32Const(0), op.set(t));
  s.streams.forEach((st, i) => b.emit(op.get(st.base), op.set(cur[i]!)));
  b.emit(op.get(s.out.base), op.get(r), op.i32Const(2), op.i32Shl, op.i32Add, op.set(yCur));
  for (const { T, fn } of s.tiles) {
    b.emit(op.block, op.loop);
    b.emit(op.get(s.nTok), op.get(t), op.i32Sub, op.i32Const(T), op.i32LtS, op.brIf(1));
    s.streams.forEach((st, i) => {
      for (let k = 0; k < T; k++) b.emit(...ptr(cur[i]!, st.stride, k));
    });
    b.emit(...s.weightArgs(b, r));
    for (let k = 0; k < T; k++) b.emit(...ptr(yCur, s.out.stride, k));
    b.emit(op.call(fn));
    b.inc(t, T);
    s.streams.forEach((st, i) => b.emit(...ptr(cur[i]!, st.stride, T), op.set(cur[i]!)));
    b.emit(...ptr(yCur, s.out.stride, T), op.set(yCur));
    b.emit(op.br(0), op.end, op.end);
  }
  b.inc(r, 4);
  b.emit(op.br(0), op.end, op.end);
  return b.body();
}
