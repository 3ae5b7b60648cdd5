// The CPU engine's memory: one WebAssembly.Memory holding a shard's matrices, the sessions' KV
// caches and the activations of the forward pass in flight, so every kernel reads and writes
// it in place (no copies in or out). Regions are allocated and freed by byte offset; the
// memory grows when full (up to 4 GiB, wasm32's limit). A shared memory (SharedArrayBuffer)
// lets worker threads run the same kernels over the same bytes (./compute-pool.ts).
//
// Growing an unshared memory detaches its old ArrayBuffer, so nothing keeps a typed-array view
// across an allocation: callers hold offsets and ask for views (`f32`, `i8`) when they compute.

import { MeshError } from '../../errors.ts';
import { ComputePool } from './compute-pool.ts';
import { dot } from './ops.ts';
import type { KernelCall, WorkerFactory } from './compute-pool.ts';
import { f32KernelModule } from './wasm-f32.ts';
import type { Attn, MmF32 } from './wasm-f32.ts';
import { q8KernelModule } from './wasm-q8.ts';
import type { MmQ8, QuantQ8 } from './wasm-q8.ts';

const PAGE = 65536;
/** wasm32 addresses 4 GiB; the last page stays unused so every offset fits an i32 comparison */
export const MAX_ARENA_BYTES = 65535 * PAGE;
const ALIGN = 16;

export function wasmSimdAvailable(): boolean {
  return f32KernelModule(false) !== null;
}

/** whether this thread can share a WebAssembly memory with workers */
export function sharedMemoryAvailable(): boolean {
  if (typeof SharedArrayBuffer === 'undefined') return false;
  const isolated = (globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated;
  return isolated !== false; // Node has no such flag; pages need cross-origin isolation
}

interface Block {
  offset: number;
  bytes: number;
}

/**
 * told of the memory once it is made, sized for the weights (Node: huge pages, ./node-threads.ts);
 * what it grows by later (KV caches, activations) keeps small pages, so what is resident stays
 * close to what is used
 */
export type MemoryAdvisor = (memory: ArrayBufferLike) => void;

export interface ArenaOptions {
  /** a shared memory, for worker threads (default false) */
  shared?: boolean;
  advise?: MemoryAdvisor;
  /** false: kernels in JS (for tests and hosts without WebAssembly SIMD) */
  simd?: boolean;
}

export class WasmArena {
  readonly memory: WebAssembly.Memory;
  readonly shared: boolean;
  /** y = x · wᵀ over rows [r0, r1), a multiple of 4 apart (./wasm-f32.ts; the JS loop without SIMD) */
  readonly mmF32: MmF32;
  /** whether mmF32 is the WebAssembly kernel */
  readonly simd: boolean;
  /** the int8 kernel (see ./wasm-q8.ts); null without WebAssembly SIMD */
  readonly mmQ8: MmQ8 | null;
  /** activations → Q8_0 for mmQ8, on this thread (see ./wasm-q8.ts); null without SIMD */
  readonly quantQ8: QuantQ8 | null;
  /** one attention unit: scores, softmax, weighted sum (./wasm-attention.ts); null without SIMD */
  readonly attn: Attn | null;
  /** g = silu(g) · u over n floats, a multiple of 4 (./wasm-elementwise.ts); null without SIMD */
  readonly swigluKernel: ((g: number, u: number, n: number) => void) | null;
  /** bytes below `top` are allocated or on the free list; above it the memory is unused */
  private top = 0;
  private readonly freeList: Block[] = []; // sorted by offset, never adjacent
  private readonly sizes = new Map<number, number>();
  private buffer: ArrayBuffer | SharedArrayBuffer | null = null;
  private heapF32: Float32Array = new Float32Array(0);
  private heapI8: Int8Array = new Int8Array(0);
  private heapI16: Int16Array = new Int16Array(0);
  /** every buffer the memory has had (a shared memory's views of older buffers stay valid) */
  private readonly buffers = new WeakSet<ArrayBufferLike>();
  private pool: ComputePool | null = null;
  private readonly advise: MemoryAdvisor | null;
  private stagingOffset = -1;
  private stagingBytes = 0;

  /** a memory of at least `initialBytes`; throws WASM_TOO_LARGE past 4 GiB */
  constructor(initialBytes: number, options: ArenaOptions = {}) {
    this.shared = options.shared ?? false;
    if (initialBytes > MAX_ARENA_BYTES) {
      throw new MeshError('WASM_TOO_LARGE', `${initialBytes} bytes do not fit one WebAssembly memory (at most ${MAX_ARENA_BYTES})`);
    }
    const pages = Math.max(1, Math.ceil(initialBytes / PAGE));
    this.memory = this.shared
      ? new WebAssembly.Memory({ initial: pages, maximum: MAX_ARENA_BYTES / PAGE, shared: true })
      : new WebAssembly.Memory({ initial: pages });
    this.advise = options.advise ?? null;
    this.advise?.(this.memory.buffer);
    const simd = options.simd ?? true;
    const f32 = simd ? f32KernelModule(this.shared) : null;
    const q8 = simd ? q8KernelModule(this.shared) : null;
    const imports = { env: { mem: this.memory } };
    this.simd = f32 !== null;
    const f32Exports = f32 ? new WebAssembly.Instance(f32, imports).exports : null;
    this.mmF32 = f32Exports ? (f32Exports.mm_f32 as MmF32) : this.mmF32Js;
    this.attn = f32Exports ? (f32Exports.attn as Attn) : null;
    this.swigluKernel = f32Exports ? (f32Exports.swiglu as (g: number, u: number, n: number) => void) : null;
    const q8Exports = q8 ? new WebAssembly.Instance(q8, imports).exports : null;
    this.mmQ8 = q8Exports ? (q8Exports.mm_q8 as MmQ8) : null;
    this.quantQ8 = q8Exports ? (q8Exports.quant_q8 as QuantQ8) : null;
  }

  /**
   * Starts `workers` threads beside this one that run kernel calls over this (shared) memory;
   * `run` then spreads its calls over all of them.
   */
  startThreads(workers: number, factory: WorkerFactory): void {
    if (!this.shared || !this.simd || !this.mmQ8) throw new MeshError('WASM_UNAVAILABLE', 'worker threads need a shared memory and the SIMD kernels');
    if (this.pool || workers < 1) return;
    const modules = [f32KernelModule(true)!, q8KernelModule(true)!];
    const names: [number, string][] = [[0, 'mm_f32'], [1, 'mm_q8'], [0, 'attn'], [0, 'swiglu']];
    this.pool = new ComputePool({ memory: this.memory, modules, names, fns: this.kernelFns() }, workers, factory);
  }

  /** threads that run kernel calls (1 without workers) */
  get threads(): number {
    return this.pool?.threads ?? 1;
  }

  /**
   * `pass` as one forward pass: the worker threads wake as it begins (while it reads its input)
   * and sleep rather than spin once it ends, however it ends (./compute-pool.ts)
   */
  pass<T>(pass: () => T): T {
    this.pool?.wake();
    try {
      return pass();
    } finally {
      this.pool?.rest();
    }
  }

  /** Runs the calls (on every thread when there are workers) and returns when all are done. */
  run(calls: readonly KernelCall[]): void {
    if (this.pool && calls.length > 1) return this.pool.run(calls);
    const fns = this.kernelFns();
    for (const c of calls) fns[c.fn]!(...c.args);
  }

  /** the kernels by id (KERNEL_IDS order) */
  private kernelFns(): ((...a: number[]) => void)[] {
    const missing = () => {
      throw new MeshError('WASM_UNAVAILABLE', 'this kernel needs WebAssembly SIMD');
    };
    return [this.mmF32, this.mmQ8 ?? missing, this.attn ?? missing, this.swigluKernel ?? missing] as ((...a: number[]) => void)[];
  }

  /** stops the worker threads; the memory goes with the last reference to it */
  dispose(): void {
    this.pool?.dispose();
    this.pool = null;
  }

  /** the whole memory as f32 (a fresh view after the memory grew) */
  get heap(): Float32Array {
    this.refresh();
    return this.heapF32;
  }

  /** the whole memory as int8 */
  get bytes(): Int8Array {
    this.refresh();
    return this.heapI8;
  }

  /** the whole memory as int16 (activations quantised for the int8 kernel) */
  get halves(): Int16Array {
    this.refresh();
    return this.heapI16;
  }

  /** `floats` f32 at byte offset `offset` (16-aligned) */
  f32(offset: number, floats: number): Float32Array {
    return this.heap.subarray(offset >> 2, (offset >> 2) + floats);
  }

  i8(offset: number, n: number): Int8Array {
    return this.bytes.subarray(offset, offset + n);
  }

  /** the byte offset of a view into this memory, or −1 for an array elsewhere */
  offsetOf(view: Float32Array | Int8Array): number {
    const b = view.buffer;
    return b === this.memory.buffer || this.buffers.has(b) ? view.byteOffset : -1;
  }

  /**
   * A scratch region of at least `bytes` for staging a kernel's inputs and outputs, valid until
   * the next call. It grows (and may grow the memory) only when too small: a forward pass
   * reserves what it needs before it takes views.
   */
  staging(bytes: number): number {
    if (bytes > this.stagingBytes) {
      if (this.stagingOffset >= 0) this.free(this.stagingOffset);
      this.stagingBytes = Math.max(bytes, 2 * this.stagingBytes, 4096);
      this.stagingOffset = this.alloc(this.stagingBytes);
    }
    return this.stagingOffset;
  }

  /** mmF32 in JS (f64 sums), for any row range: rows past a multiple of 4, hosts without SIMD */
  readonly mmF32Js: MmF32 = (x, xs, w, ws, y, ys, nIn, nTok, r0, r1) => {
    const h = this.heap;
    for (let r = r0; r < r1; r++) {
      for (let t = 0; t < nTok; t++) h[((y + t * ys) >> 2) + r] = dot(h, (x + t * xs) >> 2, h, (w + r * ws) >> 2, nIn);
    }
  };

  /** bytes the memory holds (allocated, free and unused) */
  get capacity(): number {
    return this.memory.buffer.byteLength;
  }

  /** bytes allocated now */
  get allocated(): number {
    let n = 0;
    for (const b of this.sizes.values()) n += b;
    return n;
  }

  /** Reserves `bytes` (rounded up to 16) and returns its byte offset; `zero` clears it. */
  alloc(bytes: number, zero = false): number {
    const size = Math.max(ALIGN, Math.ceil(bytes / ALIGN) * ALIGN);
    let offset = -1;
    const i = this.freeList.findIndex((b) => b.bytes >= size);
    if (i >= 0) {
      const b = this.freeList[i]!;
      offset = b.offset;
      if (b.bytes === size) this.freeList.splice(i, 1);
      else this.freeList[i] = { offset: b.offset + size, bytes: b.bytes - size };
    } else {
      offset = this.top;
      this.ensure(this.top + size);
      this.top += size;
    }
    this.sizes.set(offset, size);
    if (zero) this.bytes.fill(0, offset, offset + size);
    return offset;
  }

  /**
   * Grows the region at `offset` to `bytes` where it ends the allocated memory (no copy, no
   * hole left behind); returns false where it does not, and the caller moves it instead.
   */
  growInPlace(offset: number, bytes: number): boolean {
    const size = this.sizes.get(offset);
    if (size === undefined || offset + size !== this.top) return false;
    const next = Math.ceil(bytes / ALIGN) * ALIGN;
    if (next <= size) return true;
    this.ensure(offset + next);
    this.bytes.fill(0, offset + size, offset + next);
    this.sizes.set(offset, next);
    this.top = offset + next;
    return true;
  }

  /** Returns a region to the free list (merging it with free neighbours). */
  free(offset: number): void {
    const size = this.sizes.get(offset);
    if (size === undefined) throw new MeshError('WASM_ARENA_FULL', `no allocation at offset ${offset}`);
    this.sizes.delete(offset);
    let block: Block = { offset, bytes: size };
    let i = this.freeList.findIndex((b) => b.offset > offset);
    if (i < 0) i = this.freeList.length;
    const prev = this.freeList[i - 1];
    if (prev && prev.offset + prev.bytes === offset) {
      block = { offset: prev.offset, bytes: prev.bytes + size };
      this.freeList.splice(--i, 1);
    }
    const next = this.freeList[i];
    if (next && block.offset + block.bytes === next.offset) {
      block = { offset: block.offset, bytes: block.bytes + next.bytes };
      this.freeList.splice(i, 1);
    }
    if (block.offset + block.bytes === this.top) this.top = block.offset;
    else this.freeList.splice(i, 0, block);
  }

  private ensure(bytes: number): void {
    if (bytes > MAX_ARENA_BYTES) {
      throw new MeshError('WASM_ARENA_FULL', `the CPU engine's memory would need ${bytes} bytes, more than one WebAssembly memory holds (${MAX_ARENA_BYTES})`);
    }
    const have = this.memory.buffer.byteLength;
    if (bytes <= have) return;
    // grow by at least an eighth, so appending sessions does not grow page by page
    const want = Math.min(MAX_ARENA_BYTES, Math.max(bytes, have + have / 8));
    try {
      this.memory.grow(Math.ceil((want - have) / PAGE));
    } catch (e) {
      throw new MeshError('WASM_ARENA_FULL', `the CPU engine's memory could not grow to ${want} bytes: ${(e as Error).message}`);
    }
  }

  private refresh(): void {
    const buffer = this.memory.buffer;
    if (buffer === this.buffer && this.heapF32.byteLength === buffer.byteLength) return;
    this.buffer = buffer;
    this.buffers.add(buffer);
    this.heapF32 = new Float32Array(buffer);
    this.heapI8 = new Int8Array(buffer);
    this.heapI16 = new Int16Array(buffer);
  }
}
