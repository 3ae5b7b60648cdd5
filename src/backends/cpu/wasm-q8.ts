// WebAssembly SIMD kernels for weights stored as 8-bit integers with one f32 scale per block
// of 32 (Q8_0 as stored, Q4_0 widened to 8 bits): a quarter of the memory traffic of f32
// weights. Activations come quantised the same way (as ggml does for these types), so each
// block is an exact integer dot product (i32x4.dot_i16x8_s) times the two scales:
//
//   y[t, r] = Σ_b dx[t, b] · dw[r, b] · Σ_{j<32} qx[t, 32b + j] · qw[r, 32b + j]
//
// Text form of the kernel over T tokens (1, 2 or 4) × 4 weight rows:
//   (param xq_0..T, xd_0..T, wq, wd, nIn, y_0..T)        ;; byte pointers; nIn a multiple of 32
//   loop over blocks (i = 32·b bytes, s = 4·b bytes):
//     per token: dx = f32.load(xd+s); x = the block's 32 int8 widened to four i16x8
//     per row r: w = its 32 int8 widened; sw = f32.load(wd_r+s)
//       per token: acc[t][r] += f32x4(Σ dot_i16x8(x, w)) · splat(sw · dx)
//   y_t[r] = hsum(acc[t][r])

import { F32, I32, V128, hsum, kernelModuleBytes, lazyModule, op, uleb, vec } from './wasm-asm.ts';

function q8KernelBody(T: 1 | 2 | 4): number[] {
  // parameters: xq_0..T, xd_0..T, wq, wd, nIn, y_0..T
  const xq = Array.from({ length: T }, (_, t) => t);
  const xd = Array.from({ length: T }, (_, t) => T + t);
  const wq = 2 * T;
  const wd = wq + 1;
  const nIn = wd + 1;
  const y = Array.from({ length: T }, (_, t) => nIn + 1 + t);
  const nParams = 3 * T + 3;
  // locals: i32 × 9, then v128 × (4T + 5 + 4T), then f32 × (T + 1)
  let next = nParams;
  const rowScale = next++, i = next++, s = next++;
  const wqRow = [wq, next++, next++, next++];
  const wdRow = [wd, next++, next++, next++];
  const xv = Array.from({ length: T }, () => [next++, next++, next++, next++]); // lo/hi of bytes 0..15, lo/hi of 16..31
  const wv = [next++, next++, next++, next++];
  const raw = next++;
  const acc = Array.from({ length: T }, () => [next++, next++, next++, next++]);
  const dx = Array.from({ length: T }, () => next++);
  const sw = next++;
  const locals = vec([
    [9, I32],
    [8 * T + 5, V128],
    [T + 1, F32],
  ]);

  const code: number[] = [];
  const emit = (...parts: number[][]) => parts.forEach((p) => code.push(...p));
  // widen 32 int8 at (base + i) into four i16x8 locals
  const widen = (base: number, into: number[]) => {
    emit(op.get(base), op.get(i), op.i32Add, op.v128LoadAt(0), op.set(raw));
    emit(op.get(raw), op.i16x8ExtendLowI8x16S, op.set(into[0]!), op.get(raw), op.i16x8ExtendHighI8x16S, op.set(into[1]!));
    emit(op.get(base), op.get(i), op.i32Add, op.v128LoadAt(16), op.set(raw));
    emit(op.get(raw), op.i16x8ExtendLowI8x16S, op.set(into[2]!), op.get(raw), op.i16x8ExtendHighI8x16S, op.set(into[3]!));
  };

  emit(op.get(nIn), op.i32Const(3), op.i32ShrU, op.set(rowScale));
  for (let r = 1; r < 4; r++) {
    emit(op.get(wqRow[r - 1]!), op.get(nIn), op.i32Add, op.set(wqRow[r]!));
    emit(op.get(wdRow[r - 1]!), op.get(rowScale), op.i32Add, op.set(wdRow[r]!));
  }
  emit(op.loop);
  for (let t = 0; t < T; t++) {
    emit(op.get(xd[t]!), op.get(s), op.i32Add, op.f32Load, op.set(dx[t]!));
    widen(xq[t]!, xv[t]!);
  }
  for (let r = 0; r < 4; r++) {
    widen(wqRow[r]!, wv);
    emit(op.get(wdRow[r]!), op.get(s), op.i32Add, op.f32Load, op.set(sw));
    for (let t = 0; t < T; t++) {
      const x = xv[t]!;
      emit(op.get(x[0]!), op.get(wv[0]!), op.i32x4DotI16x8S);
      for (let k = 1; k < 4; k++) emit(op.get(x[k]!), op.get(wv[k]!), op.i32x4DotI16x8S, op.i32x4Add);
      emit(op.f32x4ConvertI32x4S, op.get(sw), op.get(dx[t]!), op.f32Mul, op.f32x4Splat, op.f32x4Mul);
      emit(op.get(acc[t]![r]!), op.f32x4Add, op.set(acc[t]![r]!));
    }
  }
  emit(op.get(i), op.i32Const(32), op.i32Add, op.set(i));
  emit(op.get(s), op.i32Const(4), op.i32Add, op.set(s));
  emit(op.get(i), op.get(nIn), op.i32LtU, op.brIf(0), op.end);
  for (let t = 0; t < T; t++) {
    for (let r = 0; r < 4; r++) emit(op.get(y[t]!), hsum(acc[t]![r]!), op.f32Store(4 * r));
  }
  const body = [...locals, ...code, ...op.end];
  return [...uleb(body.length), ...body];
}

function q8ModuleBytes(): Uint8Array<ArrayBuffer> {
  return kernelModuleBytes([
    { name: 'q4x2', params: 9, body: q8KernelBody(2) },
    { name: 'q4x1', params: 6, body: q8KernelBody(1) },
    { name: 'q4x4', params: 15, body: q8KernelBody(4) },
  ]);
}

/** the compiled int8 kernels, or null where they cannot be compiled */
export const q8KernelModule = lazyModule(q8ModuleBytes);

/** compiles the module and returns the error, for tests */
export function q8KernelError(): string | null {
  try {
    new WebAssembly.Module(q8ModuleBytes());
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}
