// A minimal WebAssembly assembler for the CPU engine's hand-written SIMD kernels: LEB128,
// sections, a function builder with typed locals, and the opcodes the kernels use (SIMD ones
// carry the 0xFD prefix). No toolchain is needed to build the project, and every kernel reads
// as the loop it is.

export const I32 = 0x7f;
export const F32 = 0x7d;
export const V128 = 0x7b;
export type ValType = typeof I32 | typeof F32 | typeof V128;

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

/** signed LEB128 of a 32-bit integer */
export function sleb(n: number): number[] {
  const out: number[] = [];
  n |= 0;
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && (b & 0x40) === 0) || (n === -1 && (b & 0x40) !== 0)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
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

const simd = (code: number) => [0xfd, ...uleb(code)];
/** memarg: alignment exponent, then a constant byte offset */
const mem = (align: number, offset: number) => [align, ...uleb(offset)];

export const op = {
  get: (i: number) => [0x20, ...uleb(i)],
  set: (i: number) => [0x21, ...uleb(i)],
  tee: (i: number) => [0x22, ...uleb(i)],
  call: (f: number) => [0x10, ...uleb(f)],
  drop: [0x1a],
  /** a if c ≠ 0 else b, for (a, b, c) on the stack */
  select: [0x1b],
  block: [0x02, 0x40],
  loop: [0x03, 0x40],
  if: [0x04, 0x40],
  else: [0x05],
  end: [0x0b],
  br: (d: number) => [0x0c, ...uleb(d)],
  brIf: (d: number) => [0x0d, ...uleb(d)],
  i32Const: (v: number) => [0x41, ...sleb(v)],
  f32Const: (v: number) => [0x43, ...new Uint8Array(Float32Array.of(v).buffer)],
  i32Eqz: [0x45],
  i32LtS: [0x48],
  i32LtU: [0x49],
  i32GtS: [0x4a],
  i32LeS: [0x4c],
  i32GeS: [0x4e],
  i32GeU: [0x4f],
  i32Add: [0x6a],
  i32Sub: [0x6b],
  i32Mul: [0x6c],
  i32And: [0x71],
  i32Shl: [0x74],
  i32ShrS: [0x75],
  i32ShrU: [0x76],
  i32Load: (offset = 0) => [0x28, ...mem(2, offset)],
  f32Load: (offset = 0) => [0x2a, ...mem(2, offset)],
  f32Ne: [0x5c],
  f32Lt: [0x5d],
  f32Ge: [0x60],
  f32Store: (offset = 0) => [0x38, ...mem(2, offset)],
  f32Add: [0x92],
  f32Sub: [0x93],
  f32Mul: [0x94],
  f32Div: [0x95],
  f32Max: [0x97],
  i32ReinterpretF32: [0xbc],
  f32ReinterpretI32: [0xbe],
  v128Load: (offset = 0) => [...simd(0x00), ...mem(0, offset)],
  v128Store: (offset = 0) => [...simd(0x0b), ...mem(0, offset)],
  v128Load32Splat: (offset = 0) => [...simd(0x09), ...mem(0, offset)],
  /** 8 bytes loaded and sign-extended to i16x8 in one instruction */
  v128Load8x8S: (offset = 0) => [...simd(0x01), ...mem(0, offset)],
  v128Const0: [...simd(0x0c), ...new Array<number>(16).fill(0)],
  /** i8x16.shuffle of the two operands by 16 lane indices (0–15 first, 16–31 second) */
  shuffle: (lanes: number[]) => [...simd(0x0d), ...lanes],
  /** v128.const of four f32 or i32 lanes */
  f32x4Const: (a: number, b = a, c = a, d = a) => [...simd(0x0c), ...new Uint8Array(Float32Array.of(a, b, c, d).buffer)],
  i32x4Const: (a: number, b = a, c = a, d = a) => [...simd(0x0c), ...new Uint8Array(Int32Array.of(a, b, c, d).buffer)],
  i32x4Splat: simd(0x11),
  f32x4Splat: simd(0x13),
  i32x4LtS: simd(0x39),
  v128And: simd(0x4e),
  v128Bitselect: simd(0x52),
  f32x4Nearest: simd(0x6a),
  i32x4Shl: simd(0xab),
  f32x4Min: simd(0xe8),
  i32x4TruncSatF32x4S: simd(0xf8),
  extract: (lane: number) => [...simd(0x1f), lane],
  i16x8NarrowI32x4S: simd(0x85),
  f32x4Abs: simd(0xe0),
  i16x8ExtendLowI8x16S: simd(0x87),
  i16x8ExtendHighI8x16S: simd(0x88),
  i32x4Add: simd(0xae),
  i32x4DotI16x8S: simd(0xba),
  f32x4Add: simd(0xe4),
  f32x4Sub: simd(0xe5),
  f32x4Mul: simd(0xe6),
  f32x4Div: simd(0xe7),
  f32x4Max: simd(0xe9),
  f32x4ConvertI32x4S: simd(0xfa),
  /** relaxed SIMD: a · b + c, fused where the hardware has FMA */
  f32x4RelaxedMadd: simd(0x105),
};

/** a module of one function `() -> v128` with this body (locals vector first), for feature probes */
function probe(body: number[]): boolean {
  const t = [0x60, 0x00, 0x01, V128];
  const code = [0x00, ...body, ...op.end];
  const bytes = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, ...section(1, vec([t])), ...section(3, vec([[0]])), ...section(10, vec([[...uleb(code.length), ...code]]))];
  return typeof WebAssembly === 'object' && WebAssembly.validate(new Uint8Array(bytes));
}

/** whether this engine has WebAssembly SIMD (checked without compiling the kernels) */
export function simdAvailable(): boolean {
  return probe([...op.v128Const0, ...op.v128Const0, ...op.f32x4Add]);
}

/** whether this engine validates relaxed SIMD (f32x4.relaxed_madd): browsers since 2023, Node 22+, Node 20 with its flag */
export const relaxedSimdAvailable: () => boolean = (() => {
  let known: boolean | undefined;
  return () => {
    known ??= probe([...op.v128Const0, ...op.v128Const0, ...op.v128Const0, ...op.f32x4RelaxedMadd]);
    return known;
  };
})();

/** i32 lanes as byte indices for `op.shuffle`: lane a of the first operand is a, of the second 4 + a */
export function lanes32(...idx: number[]): number[] {
  return idx.flatMap((i) => [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3]);
}

/**
 * One function being assembled: `params` i32 parameters (locals 0 … params−1), more locals
 * declared as needed, and code appended with `emit`.
 */
export class FnBuilder {
  private readonly runs: [number, ValType][] = [];
  private nextLocal: number;
  readonly code: number[] = [];

  constructor(readonly params: number) {
    this.nextLocal = params;
  }

  local(type: ValType): number {
    const last = this.runs.at(-1);
    if (last && last[1] === type) last[0]++;
    else this.runs.push([1, type]);
    return this.nextLocal++;
  }

  locals(type: ValType, n: number): number[] {
    return Array.from({ length: n }, () => this.local(type));
  }

  emit(...parts: number[][]): this {
    for (const p of parts) this.code.push(...p);
    return this;
  }

  /** `counter += step` for an i32 local */
  inc(counter: number, step: number): this {
    return this.emit(op.get(counter), op.i32Const(step), op.i32Add, op.set(counter));
  }

  /** the code-section entry: size, local declarations, code, end */
  body(): number[] {
    const body = [...vec(this.runs.map(([n, t]) => [...uleb(n), t])), ...this.code, ...op.end];
    return [...uleb(body.length), ...body];
  }
}

/** sum of the four lanes of the f32x4 in local `v`: ((v0 + v1) + v2) + v3 */
export function hsum(v: number): number[] {
  return [...op.get(v), ...op.extract(0), ...op.get(v), ...op.extract(1), ...op.f32Add, ...op.get(v), ...op.extract(2), ...op.f32Add, ...op.get(v), ...op.extract(3), ...op.f32Add];
}

/** One function of a kernel module: i32 parameters, no results; exported when it has a name. */
export interface KernelFunction {
  name?: string;
  params: number;
  /** size-prefixed locals + code, as a code-section entry (FnBuilder.body()) */
  body: number[];
}

/**
 * A module of kernels over an imported memory `env.mem` (shared or not: a module must match the
 * memory it links to). Function i has its own type (its i32 parameters) and calls others by index.
 */
export function kernelModuleBytes(kernels: readonly KernelFunction[], shared: boolean): Uint8Array<ArrayBuffer> {
  const type = (params: number) => [0x60, ...vec(Array.from({ length: params }, () => [I32])), 0x00];
  // limits: 0x00 min; 0x03 shared with min and max (a shared memory must declare a maximum)
  const limits = shared ? [0x03, 0x00, ...uleb(65536)] : [0x00, 0x00];
  const exported = kernels.map((k, i) => [k, i] as const).filter(([k]) => k.name);
  const bytes = [
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // "\0asm", version 1
    ...section(1, vec(kernels.map((k) => type(k.params)))),
    ...section(2, vec([[...str('env'), ...str('mem'), 0x02, ...limits]])),
    ...section(3, vec(kernels.map((_, i) => [i]))),
    ...section(7, vec(exported.map(([k, i]) => [...str(k.name!), 0x00, i]))),
    ...section(10, vec(kernels.map((k) => k.body))),
  ];
  return new Uint8Array(bytes);
}

/** Compiles once per memory kind, on first call; null from then on where compiling failed (no SIMD). */
export function lazyModule(bytes: (shared: boolean) => Uint8Array<ArrayBuffer>): (shared: boolean) => WebAssembly.Module | null {
  const compiled = new Map<boolean, WebAssembly.Module | null>();
  return (shared) => {
    if (!compiled.has(shared)) {
      try {
        compiled.set(shared, new WebAssembly.Module(bytes(shared)));
      } catch {
        compiled.set(shared, null);
      }
    }
    return compiled.get(shared)!;
  };
}
