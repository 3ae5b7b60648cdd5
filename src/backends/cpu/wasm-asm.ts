// A minimal WebAssembly assembler for the CPU engine's hand-written SIMD kernels: LEB128,
// sections, and the handful of opcodes they use (SIMD ones carry the 0xFD prefix).

export const I32 = 0x7f;
export const V128 = 0x7b;
export const F32 = 0x7d;

export function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

export function section(id: number, body: number[]): number[] {
  return [id, ...uleb(body.length), ...body];
}

export function vec(items: number[][]): number[] {
  return [...uleb(items.length), ...items.flat()];
}

export function str(s: string): number[] {
  const b = [...new TextEncoder().encode(s)];
  return [...uleb(b.length), ...b];
}

export const op = {
  get: (i: number) => [0x20, ...uleb(i)],
  set: (i: number) => [0x21, ...uleb(i)],
  i32Const: (v: number) => [0x41, ...uleb(v)], // small non-negative constants only
  i32Add: [0x6a],
  i32Shl: [0x74],
  i32LtU: [0x49],
  loop: [0x03, 0x40],
  brIf: (d: number) => [0x0d, ...uleb(d)],
  end: [0x0b],
  v128Load: [0xfd, 0x00, 0x02, 0x00], // align 2^2, offset 0
  f32x4Add: [0xfd, 0xe4, 0x01],
  f32x4Mul: [0xfd, 0xe6, 0x01],
  extract: (lane: number) => [0xfd, 0x1f, lane],
  f32Add: [0x92],
  f32Store: (offset: number) => [0x38, 0x02, ...uleb(offset)],
  f32Load: [0x2a, 0x02, 0x00],
  v128LoadAt: (offset: number) => [0xfd, 0x00, 0x00, ...uleb(offset)],
  i32ShrU: [0x76],
  f32Mul: [0x94],
  f32x4Splat: [0xfd, 0x13],
  i16x8ExtendLowI8x16S: [0xfd, 0x87, 0x01],
  i16x8ExtendHighI8x16S: [0xfd, 0x88, 0x01],
  i32x4DotI16x8S: [0xfd, 0xba, 0x01],
  i32x4Add: [0xfd, 0xae, 0x01],
  f32x4ConvertI32x4S: [0xfd, 0xfa, 0x01],
};

/** sum of the four lanes of the f32x4 in local `v`: ((v0 + v1) + v2) + v3 */
export function hsum(v: number): number[] {
  return [...op.get(v), ...op.extract(0), ...op.get(v), ...op.extract(1), ...op.f32Add, ...op.get(v), ...op.extract(2), ...op.f32Add, ...op.get(v), ...op.extract(3), ...op.f32Add];
}

/** One exported kernel: its name, how many i32 parameters it takes, and its encoded body. */
export interface KernelFunction {
  name: string;
  params: number;
  /** size-prefixed locals + code, as a code-section entry */
  body: number[];
}

/**
 * A module of kernels over an imported memory `env.mem`: function i has type i (its i32
 * parameters, no results) and is exported under its name.
 */
export function kernelModuleBytes(kernels: readonly KernelFunction[]): Uint8Array<ArrayBuffer> {
  const type = (params: number) => [0x60, ...vec(Array.from({ length: params }, () => [I32])), 0x00];
  const bytes = [
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // "\0asm", version 1
    ...section(1, vec(kernels.map((k) => type(k.params)))),
    ...section(2, vec([[...str('env'), ...str('mem'), 0x02, 0x00, 0x00]])), // memory import, min 0 pages
    ...section(3, vec(kernels.map((_, i) => [i]))),
    ...section(7, vec(kernels.map((k, i) => [...str(k.name), 0x00, i]))),
    ...section(10, vec(kernels.map((k) => k.body))),
  ];
  return new Uint8Array(bytes);
}

/** Compiles `bytes()` once, on first call; null from then on where compiling failed (no SIMD). */
export function lazyModule(bytes: () => Uint8Array<ArrayBuffer>): () => WebAssembly.Module | null {
  let compiled: WebAssembly.Module | null | undefined;
  return () => {
    if (compiled === undefined) {
      try {
        compiled = new WebAssembly.Module(bytes());
      } catch {
        compiled = null;
      }
    }
    return compiled;
  };
}
