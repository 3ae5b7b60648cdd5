// A WebAssembly SIMD matmul for the CPU engine: f32 weights live in one WebAssembly.Memory
// (the "arena"), activations are copied in, and a hand-assembled kernel multiplies four
// weight rows by one or two tokens with f32x4 lanes. JS scalar code tops out near 1.5
// GFLOP/s; this runs several times faster and keeps the same loop order as ops.matmul.
// The arena also runs the int8 kernels of ./wasm-q8.ts. Both modules are under 4 KB, so
// browsers allow compiling them synchronously on the main thread.
//
// The module is assembled here byte by byte (no toolchain in the build); its text form:
//
//   (func $k4x2 (param $x0 $x1 $w $nIn $y0 $y1 i32)   ;; pointers in bytes, nIn in floats (multiple of 4)
//     rowBytes = nIn·4; w1..w3 = the next rows; i = 0
//     loop: xa = v128.load(x0+i); xb = v128.load(x1+i)
//           for r in 0..3: wv = v128.load(wr+i); a_r += xa·wv; b_r += xb·wv
//           i += 16; br_if loop (i < rowBytes)
//     y0[r] = hsum(a_r); y1[r] = hsum(b_r))
//   (func $k4x1 (param $x0 $w $nIn $y0 i32) …the same for one token)

import { MeshError } from '../../errors.ts';
import { quantizeRowsQ8_0 } from './act-round.ts';
import { matmulRows } from './ops.ts';
import { q8KernelModule } from './wasm-q8.ts';

import { I32, V128, kernelModuleBytes, lazyModule, op, uleb, vec } from './wasm-asm.ts';

/** body of a kernel over `tokens` (1 or 2) token rows × 4 weight rows */
function kernelBody(tokens: 1 | 2): number[] {
  // params: x0, [x1], w, nIn, y0, [y1]
  const x = tokens === 2 ? [0, 1] : [0];
  const w = tokens === 2 ? 2 : 1;
  const nIn = w + 1;
  const y = tokens === 2 ? [4, 5] : [3];
  const nParams = tokens === 2 ? 6 : 4;
  // i32 locals: rowBytes, i, w1, w2, w3; v128 locals: xs (tokens), wv, acc (4 × tokens)
  const rowBytes = nParams, i = nParams + 1, wRow = [w, nParams + 2, nParams + 3, nParams + 4];
  const vBase = nParams + 5;
  const xv = x.map((_, t) => vBase + t);
  const wv = vBase + tokens;
  const acc = (t: number, r: number) => vBase + tokens + 1 + t * 4 + r;
  const locals = vec([
    [5, I32],
    [tokens + 1 + 4 * tokens, V128],
  ]);
  const code: number[] = [];
  const emit = (...parts: number[][]) => parts.forEach((p) => code.push(...p));
  emit(op.get(nIn), op.i32Const(2), op.i32Shl, op.set(rowBytes));
  for (let r = 1; r < 4; r++) emit(op.get(wRow[r - 1]!), op.get(rowBytes), op.i32Add, op.set(wRow[r]!));
  emit(op.loop);
  x.forEach((p, t) => emit(op.get(p), op.get(i), op.i32Add, op.v128Load, op.set(xv[t]!)));
  for (let r = 0; r < 4; r++) {
    emit(op.get(wRow[r]!), op.get(i), op.i32Add, op.v128Load, op.set(wv));
    for (let t = 0; t < tokens; t++) {
      emit(op.get(acc(t, r)), op.get(xv[t]!), op.get(wv), op.f32x4Mul, op.f32x4Add, op.set(acc(t, r)));
    }
  }
  emit(op.get(i), op.i32Const(16), op.i32Add, op.set(i), op.get(i), op.get(rowBytes), op.i32LtU, op.brIf(0), op.end);
  for (let t = 0; t < tokens; t++) {
    for (let r = 0; r < 4; r++) {
      const a = acc(t, r);
      emit(op.get(y[t]!), op.get(a), op.extract(0), op.get(a), op.extract(1), op.f32Add, op.get(a), op.extract(2), op.f32Add);
      emit(op.get(a), op.extract(3), op.f32Add, op.f32Store(4 * r));
    }
  }
  const body = [...locals, ...code, ...op.end];
  return [...uleb(body.length), ...body];
}

function moduleBytes(): Uint8Array<ArrayBuffer> {
  return kernelModuleBytes([
    { name: 'k4x2', params: 6, body: kernelBody(2) },
    { name: 'k4x1', params: 4, body: kernelBody(1) },
  ]);
}

/** the compiled kernels, or null where WebAssembly SIMD is unavailable */
const kernelModule = lazyModule(moduleBytes);

export function wasmSimdAvailable(): boolean {
  return kernelModule() !== null;
}

const PAGE = 65536;
/** activations staged per call: [tokens × (nIn + nOut)] f32 */
const SCRATCH_BYTES = 16 * 1024 * 1024;
const MAX_BYTES = 65536 * PAGE;

/**
 * An arena for `weightBytes` of weights (allocations are 16-byte aligned: count that in), or null when WebAssembly SIMD is unavailable or
 * the weights do not fit one WebAssembly memory (4 GiB) or cannot be allocated: callers then
 * multiply in JS.
 */
export function tryWasmArena(weightBytes: number): WasmArena | null {
  if (!wasmSimdAvailable() || weightBytes + SCRATCH_BYTES > MAX_BYTES) return null;
  try {
    return new WasmArena(weightBytes);
  } catch {
    return null;
  }
}

/**
 * One WebAssembly.Memory holding a shard's f32 weight matrices (fixed size, never grown, so
 * views stay valid) plus a scratch area for activations.
 */
export class WasmArena {
  readonly memory: WebAssembly.Memory;
  /** the whole memory as f32 */
  readonly heap: Float32Array;
  private next = 0; // bytes allocated so far
  private readonly scratch: number; // byte offset of the scratch area
  private readonly k4x2: (x0: number, x1: number, w: number, nIn: number, y0: number, y1: number) => void;
  private readonly k4x1: (x0: number, w: number, nIn: number, y0: number) => void;
  private readonly q4x2: ((xq0: number, xq1: number, xd0: number, xd1: number, wq: number, wd: number, nIn: number, y0: number, y1: number) => void) | null = null;
  private readonly q4x1: ((xq0: number, xd0: number, wq: number, wd: number, nIn: number, y0: number) => void) | null = null;
  private readonly q4x4: ((...ptrs: number[]) => void) | null = null;

  constructor(weightBytesWanted: number) {
    const module = kernelModule();
    if (!module) throw new MeshError('WASM_UNAVAILABLE', 'WebAssembly SIMD is not available here');
    const weightBytes = Math.ceil(weightBytesWanted / 16) * 16;
    const total = weightBytes + SCRATCH_BYTES;
    if (total > MAX_BYTES) throw new MeshError('WASM_TOO_LARGE', `${total} bytes of weights do not fit one WebAssembly memory`);
    const pages = Math.ceil(total / PAGE);
    this.memory = new WebAssembly.Memory({ initial: pages, maximum: pages });
    this.heap = new Float32Array(this.memory.buffer);
    this.scratch = weightBytes;
    const instance = new WebAssembly.Instance(module, { env: { mem: this.memory } });
    this.k4x2 = instance.exports.k4x2 as WasmArena['k4x2'];
    this.k4x1 = instance.exports.k4x1 as WasmArena['k4x1'];
    const q8 = q8KernelModule();
    if (q8) {
      const q = new WebAssembly.Instance(q8, { env: { mem: this.memory } });
      this.q4x2 = q.exports.q4x2 as WasmArena['q4x2'];
      this.q4x1 = q.exports.q4x1 as WasmArena['q4x1'];
      this.q4x4 = q.exports.q4x4 as WasmArena['q4x4'];
    }
  }

  /** whether int8 matrices (allocInt8 + matmulQ8) are available */
  get hasInt8(): boolean {
    return this.q4x1 !== null;
  }

  /** reserves `n` int8 (16-byte aligned) and returns a view of them */
  allocInt8(n: number): Int8Array {
    const offset = this.next;
    this.next += Math.ceil(n / 16) * 16;
    if (this.next > this.scratch) throw new MeshError('WASM_ARENA_FULL', 'weight arena overflow');
    return new Int8Array(this.memory.buffer, offset, n);
  }

  /**
   * y = x · wᵀ for int8 weights with a scale per 32-block (w[r, j] = wq[r, j] · wd[r, ⌊j/32⌋]):
   * x is quantised to Q8_0 blocks as ggml does, then each block is an integer dot product.
   * x: [nTokens × nIn] f32; wq: [nOut × nIn] int8 and wd: [nOut × nIn/32] f32, both from
   * this arena; y: [nTokens × nOut]. nIn a multiple of 32, nOut a multiple of 4.
   */
  matmulQ8(y: Float32Array, x: Float32Array, wq: Int8Array, wd: Float32Array, nTokens: number, nIn: number, nOut: number): void {
    if (!this.q4x1 || !this.q4x2 || !this.q4x4) throw new MeshError('WASM_UNAVAILABLE', 'int8 kernels are not available');
    const nb = nIn / 32;
    const xqBytes = (n: number) => Math.ceil((n * nIn) / 16) * 16;
    const perToken = nIn + nb * 4 + nOut * 4 + 48;
    const chunk = Math.max(1, Math.floor(SCRATCH_BYTES / perToken));
    const bytes = new Int8Array(this.memory.buffer);
    for (let t0 = 0; t0 < nTokens; t0 += chunk) {
      const n = Math.min(chunk, nTokens - t0);
      const xqOff = this.scratch; // [n × nIn] int8
      const xdOff = xqOff + xqBytes(n); // [n × nb] f32
      const yOff = xdOff + Math.ceil((n * nb * 4) / 16) * 16; // [n × nOut] f32
      quantizeRowsQ8_0(x.subarray(t0 * nIn, (t0 + n) * nIn), n, nIn, bytes, xqOff, this.heap, xdOff / 4);
      for (let o = 0; o < nOut; o += 4) {
        const wqo = wq.byteOffset + o * nIn;
        const wdo = wd.byteOffset + o * nb * 4;
        let t = 0;
        for (; t + 4 <= n; t += 4) {
          const xq = xqOff + t * nIn;
          const xd = xdOff + t * nb * 4;
          const yo = yOff + (t * nOut + o) * 4;
          this.q4x4(xq, xq + nIn, xq + 2 * nIn, xq + 3 * nIn, xd, xd + nb * 4, xd + 2 * nb * 4, xd + 3 * nb * 4, wqo, wdo, nIn, yo, yo + nOut * 4, yo + 2 * nOut * 4, yo + 3 * nOut * 4);
        }
        for (; t + 2 <= n; t += 2) {
          this.q4x2(xqOff + t * nIn, xqOff + (t + 1) * nIn, xdOff + t * nb * 4, xdOff + (t + 1) * nb * 4, wqo, wdo, nIn, yOff + (t * nOut + o) * 4, yOff + ((t + 1) * nOut + o) * 4);
        }
        if (t < n) this.q4x1(xqOff + t * nIn, xdOff + t * nb * 4, wqo, wdo, nIn, yOff + (t * nOut + o) * 4);
      }
      y.set(this.heap.subarray(yOff / 4, yOff / 4 + n * nOut), t0 * nOut);
    }
  }

  /** reserves `floats` f32 (16-byte aligned) and returns a view of them */
  alloc(floats: number): Float32Array {
    const offset = this.next;
    this.next += Math.ceil((floats * 4) / 16) * 16;
    if (this.next > this.scratch) throw new MeshError('WASM_ARENA_FULL', 'weight arena overflow');
    return this.heap.subarray(offset / 4, offset / 4 + floats);
  }

  /**
   * y = x · wᵀ with w a view returned by alloc. x: [nTokens × nIn]; w: [nOut × nIn];
   * y: [nTokens × nOut]. nIn must be a multiple of 4; rows beyond a multiple of 4 use JS.
   */
  matmul(y: Float32Array, x: Float32Array, w: Float32Array, nTokens: number, nIn: number, nOut: number): void {
    const perToken = (nIn + nOut) * 4;
    if (nIn % 4 !== 0 || w.buffer !== this.memory.buffer || perToken > SCRATCH_BYTES) {
      matmulRows(y, x, w, nTokens, nIn, nOut, 0, nOut, 0);
      return;
    }
    const wBase = w.byteOffset;
    const chunk = Math.max(1, Math.floor(SCRATCH_BYTES / perToken));
    const rows4 = nOut - (nOut % 4);
    for (let t0 = 0; t0 < nTokens; t0 += chunk) {
      const n = Math.min(chunk, nTokens - t0);
      const xOff = this.scratch; // [n × nIn]
      const yOff = this.scratch + n * nIn * 4; // [n × nOut]
      this.heap.set(x.subarray(t0 * nIn, (t0 + n) * nIn), xOff / 4);
      for (let o = 0; o < rows4; o += 4) {
        const wo = wBase + o * nIn * 4;
        let t = 0;
        for (; t + 2 <= n; t += 2) {
          this.k4x2(xOff + t * nIn * 4, xOff + (t + 1) * nIn * 4, wo, nIn, yOff + (t * nOut + o) * 4, yOff + ((t + 1) * nOut + o) * 4);
        }
        if (t < n) this.k4x1(xOff + t * nIn * 4, wo, nIn, yOff + (t * nOut + o) * 4);
      }
      const yChunk = y.subarray(t0 * nOut, (t0 + n) * nOut);
      yChunk.set(this.heap.subarray(yOff / 4, yOff / 4 + n * nOut));
      if (rows4 < nOut) matmulRows(yChunk, x.subarray(t0 * nIn, (t0 + n) * nIn), w, n, nIn, nOut, rows4, nOut, rows4);
    }
  }
}
