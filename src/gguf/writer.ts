// GGUF v3 writer (the @huggingface/gguf package only reads). Used to build synthetic models
// for tests and benchmarks and header-only files that mimic huge models.
//
// Layout written (all little-endian):
//   "GGUF" · u32 version=3 · u64 tensor_count · u64 kv_count
//   kv_count × (string key · u32 value_type · value)
//   tensor_count × (string name · u32 n_dims · u64 ne[n_dims] · u32 ggml_type · u64 offset)
//   zero padding to `alignment`
//   tensor data, each tensor starting at a multiple of `alignment` from the data start and
//   followed by zero padding to the next multiple (as ggml's own writer does)
// A string is u64 byte length + UTF-8 bytes; an array is u32 item_type · u64 count · items.

import { MeshError } from '../errors.ts';
import { GgmlType, TYPE_TRAITS, tensorBytes } from './types.ts';

/** GGUF metadata value type ids (gguf.h `enum gguf_type`). */
export enum GgufValueType {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
}

/** The scalar type names a metadata entry may use; the type is always explicit because
 *  llama.cpp checks it (a u32 key written as i32 fails to load). */
export type ScalarKind =
  | 'uint8' | 'int8' | 'uint16' | 'int16' | 'uint32' | 'int32' | 'float32'
  | 'bool' | 'string' | 'uint64' | 'int64' | 'float64';

const SCALAR_IDS: Record<ScalarKind, GgufValueType> = {
  uint8: GgufValueType.UINT8,
  int8: GgufValueType.INT8,
  uint16: GgufValueType.UINT16,
  int16: GgufValueType.INT16,
  uint32: GgufValueType.UINT32,
  int32: GgufValueType.INT32,
  float32: GgufValueType.FLOAT32,
  bool: GgufValueType.BOOL,
  string: GgufValueType.STRING,
  uint64: GgufValueType.UINT64,
  int64: GgufValueType.INT64,
  float64: GgufValueType.FLOAT64,
};

type Scalar = number | bigint | boolean | string;
type ArrayValues = readonly Scalar[] | ArrayLike<number>;

/** One metadata key/value, in file order. 64-bit integers accept number or bigint. */
export type MetadataEntry =
  | { key: string; type: ScalarKind; value: Scalar }
  | { key: string; type: 'array'; itemType: ScalarKind; value: ArrayValues };

/**
 * A tensor's bytes: a ready buffer, or a producer called once when the tensor is written that
 * yields its bytes in pieces (so a file writer never holds more than one piece of one tensor).
 */
export type TensorData = Uint8Array | (() => Iterable<Uint8Array>);

export interface TensorSpec {
  name: string;
  type: GgmlType;
  /** ggml order: shape[0] is the contiguous dimension */
  shape: readonly number[];
  /** omitted only with `headerOnly` */
  data?: TensorData;
}

export interface GgufSpec {
  metadata: readonly MetadataEntry[];
  tensors: readonly TensorSpec[];
  /** write the header (with full tensor infos and final offsets) but no tensor data */
  headerOnly?: boolean;
}

/** Where each tensor landed, for callers that want to check or index the file. */
export interface WrittenLayout {
  alignment: number;
  /** absolute offset of the (aligned) data section */
  tensorDataOffset: number;
  /** absolute offsets and lengths of every tensor's data */
  tensors: { name: string; offset: number; byteLength: number }[];
  /** bytes of the whole file as written (header-only files stop after the header padding) */
  fileBytes: number;
}

const DEFAULT_ALIGNMENT = 32;
const encoder = new TextEncoder();

/** A little-endian byte sink that grows as needed. */
class ByteSink {
  private buf = new Uint8Array(1 << 16);
  private view = new DataView(this.buf.buffer);
  length = 0;

  private reserve(n: number): void {
    if (this.length + n <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < this.length + n) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  u8(v: number): void { this.reserve(1); this.view.setUint8(this.length, v); this.length += 1; }
  i8(v: number): void { this.reserve(1); this.view.setInt8(this.length, v); this.length += 1; }
  u16(v: number): void { this.reserve(2); this.view.setUint16(this.length, v, true); this.length += 2; }
  i16(v: number): void { this.reserve(2); this.view.setInt16(this.length, v, true); this.length += 2; }
  u32(v: number): void { this.reserve(4); this.view.setUint32(this.length, v, true); this.length += 4; }
  i32(v: number): void { this.reserve(4); this.view.setInt32(this.length, v, true); this.length += 4; }
  f32(v: number): void { this.reserve(4); this.view.setFloat32(this.length, v, true); this.length += 4; }
  f64(v: number): void { this.reserve(8); this.view.setFloat64(this.length, v, true); this.length += 8; }
  u64(v: number | bigint): void { this.reserve(8); this.view.setBigUint64(this.length, BigInt(v), true); this.length += 8; }
  i64(v: number | bigint): void { this.reserve(8); this.view.setBigInt64(this.length, BigInt(v), true); this.length += 8; }
  bytes(b: Uint8Array): void { this.reserve(b.length); this.buf.set(b, this.length); this.length += b.length; }
  string(s: string): void { const b = encoder.encode(s); this.u64(b.length); this.bytes(b); }
  zeros(n: number): void { this.reserve(n); this.buf.fill(0, this.length, this.length + n); this.length += n; }
  result(): Uint8Array { return this.buf.slice(0, this.length); }
}

function bad(message: string): MeshError {
  return new MeshError('GGUF_WRITE_INVALID', message);
}

function checkInt(key: string, kind: ScalarKind, v: Scalar, min: bigint, max: bigint): void {
  let b: bigint;
  if (typeof v === 'bigint') b = v;
  else if (typeof v === 'number' && Number.isInteger(v)) b = BigInt(v);
  else throw bad(`metadata '${key}': ${kind} needs an integer, got ${String(v)}`);
  if (b < min || b > max) throw bad(`metadata '${key}': ${String(v)} does not fit in ${kind}`);
}

const INT_RANGES: Partial<Record<ScalarKind, [bigint, bigint]>> = {
  uint8: [0n, 255n],
  int8: [-128n, 127n],
  uint16: [0n, 65535n],
  int16: [-32768n, 32767n],
  uint32: [0n, 4294967295n],
  int32: [-2147483648n, 2147483647n],
  uint64: [0n, 18446744073709551615n],
  int64: [-9223372036854775808n, 9223372036854775807n],
};

function writeScalar(out: ByteSink, key: string, kind: ScalarKind, v: Scalar): void {
  const range = INT_RANGES[kind];
  if (range) checkInt(key, kind, v, range[0], range[1]);
  switch (kind) {
    case 'uint8': return out.u8(Number(v));
    case 'int8': return out.i8(Number(v));
    case 'uint16': return out.u16(Number(v));
    case 'int16': return out.i16(Number(v));
    case 'uint32': return out.u32(Number(v));
    case 'int32': return out.i32(Number(v));
    case 'uint64': return out.u64(v as number | bigint);
    case 'int64': return out.i64(v as number | bigint);
    case 'float32':
    case 'float64':
      if (typeof v !== 'number') throw bad(`metadata '${key}': ${kind} needs a number, got ${typeof v}`);
      return kind === 'float32' ? out.f32(v) : out.f64(v);
    case 'bool':
      if (typeof v !== 'boolean') throw bad(`metadata '${key}': bool needs true/false, got ${typeof v}`);
      return out.u8(v ? 1 : 0);
    case 'string':
      if (typeof v !== 'string') throw bad(`metadata '${key}': string needs a string, got ${typeof v}`);
      return out.string(v);
  }
}

function writeEntry(out: ByteSink, e: MetadataEntry): void {
  out.string(e.key);
  if (e.type === 'array') {
    const itemId = SCALAR_IDS[e.itemType];
    if (itemId === undefined) throw bad(`metadata '${e.key}': unknown array item type '${String(e.itemType)}'`);
    out.u32(GgufValueType.ARRAY);
    out.u32(itemId);
    out.u64(e.value.length);
    const items = e.value as ArrayLike<Scalar>;
    // fast paths for the big numeric arrays of a vocabulary (scores, token types)
    if (e.itemType === 'float32') {
      for (let i = 0; i < items.length; i++) out.f32(items[i] as number);
    } else if (e.itemType === 'int32') {
      for (let i = 0; i < items.length; i++) {
        const v = items[i] as number;
        if (!Number.isInteger(v) || v < -2147483648 || v > 2147483647) throw bad(`metadata '${e.key}'[${i}]: ${v} does not fit in int32`);
        out.i32(v);
      }
    } else {
      for (let i = 0; i < items.length; i++) writeScalar(out, `${e.key}[${i}]`, e.itemType, items[i]!);
    }
    return;
  }
  const id = SCALAR_IDS[e.type];
  if (id === undefined) throw bad(`metadata '${e.key}': unknown value type '${String(e.type)}'`);
  out.u32(id);
  writeScalar(out, e.key, e.type, e.value);
}

function alignUp(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

function alignmentOf(metadata: readonly MetadataEntry[]): number {
  const e = metadata.find((m) => m.key === 'general.alignment');
  if (!e) return DEFAULT_ALIGNMENT;
  if (e.type !== 'uint32') throw bad(`general.alignment must be uint32, got ${e.type}`);
  const a = Number(e.value);
  if (!Number.isInteger(a) || a <= 0 || (a & (a - 1)) !== 0) throw bad(`general.alignment must be a power of two, got ${String(e.value)}`);
  return a;
}

interface PlannedTensor {
  spec: TensorSpec;
  /** offset relative to the data section */
  relOffset: number;
  byteLength: number;
}

/** Encodes the header and computes where every tensor goes. */
function planHeader(spec: GgufSpec): { header: Uint8Array; planned: PlannedTensor[]; layout: WrittenLayout } {
  const alignment = alignmentOf(spec.metadata);
  const keys = new Set<string>();
  for (const m of spec.metadata) {
    if (keys.has(m.key)) throw bad(`metadata key '${m.key}' appears twice`);
    keys.add(m.key);
  }
  const names = new Set<string>();
  const planned: PlannedTensor[] = [];
  let rel = 0;
  for (const t of spec.tensors) {
    if (names.has(t.name)) throw bad(`tensor '${t.name}' appears twice`);
    names.add(t.name);
    if (!TYPE_TRAITS[t.type]) throw bad(`tensor '${t.name}': unknown ggml type ${t.type}`);
    if (t.shape.length < 1 || t.shape.length > 4) throw bad(`tensor '${t.name}': ${t.shape.length} dimensions (1 to 4 allowed)`);
    if (t.shape.some((d) => !Number.isSafeInteger(d) || d < 1)) throw bad(`tensor '${t.name}': bad shape [${t.shape.join(', ')}]`);
    const traits = TYPE_TRAITS[t.type]!;
    if (t.shape[0]! % traits.blockSize !== 0) {
      throw bad(`tensor '${t.name}': row length ${t.shape[0]} is not a multiple of the ${traits.name} block size ${traits.blockSize}`);
    }
    const n = t.shape.reduce((a, b) => a * b, 1);
    const byteLength = tensorBytes(t.type, n);
    planned.push({ spec: t, relOffset: rel, byteLength });
    rel = alignUp(rel + byteLength, alignment);
  }

  const out = new ByteSink();
  out.bytes(encoder.encode('GGUF'));
  out.u32(3);
  out.u64(spec.tensors.length);
  out.u64(spec.metadata.length);
  for (const m of spec.metadata) writeEntry(out, m);
  for (const p of planned) {
    out.string(p.spec.name);
    out.u32(p.spec.shape.length);
    for (const d of p.spec.shape) out.u64(d);
    out.u32(p.spec.type);
    out.u64(p.relOffset);
  }
  const tensorDataOffset = alignUp(out.length, alignment);
  out.zeros(tensorDataOffset - out.length);
  const layout: WrittenLayout = {
    alignment,
    tensorDataOffset,
    tensors: planned.map((p) => ({ name: p.spec.name, offset: tensorDataOffset + p.relOffset, byteLength: p.byteLength })),
    fileBytes: spec.headerOnly ? tensorDataOffset : tensorDataOffset + rel,
  };
  return { header: out.result(), planned, layout };
}

/** Yields a tensor's bytes, checking that the producer gives exactly the planned length. */
function* tensorPieces(p: PlannedTensor): Iterable<Uint8Array> {
  const data = p.spec.data;
  if (data === undefined) throw bad(`tensor '${p.spec.name}' has no data (only a headerOnly write may omit it)`);
  let written = 0;
  for (const piece of typeof data === 'function' ? data() : [data]) {
    written += piece.length;
    if (written > p.byteLength) break;
    yield piece;
  }
  if (written !== p.byteLength) {
    throw bad(`tensor '${p.spec.name}': got ${written} bytes of data, its type and shape need ${p.byteLength}`);
  }
}

/** Returns the layout a spec would be written with, without producing any tensor data. */
export function planGguf(spec: GgufSpec): WrittenLayout {
  return planHeader(spec).layout;
}

/** Writes a whole GGUF into memory. */
export function writeGguf(spec: GgufSpec): Uint8Array {
  const { header, planned, layout } = planHeader(spec);
  const file = new Uint8Array(layout.fileBytes); // zero-filled: padding needs no writes
  file.set(header, 0);
  if (spec.headerOnly) return file;
  for (const p of planned) {
    let at = layout.tensorDataOffset + p.relOffset;
    for (const piece of tensorPieces(p)) {
      file.set(piece, at);
      at += piece.length;
    }
  }
  return file;
}

/**
 * Streams a GGUF to a file: the header, then each tensor's pieces as its producer yields them,
 * so a model far larger than memory can be written. Node only (node:fs is imported lazily so
 * that browser code can use `writeGguf`). Returns the layout written.
 */
export async function writeGgufFile(path: string, spec: GgufSpec): Promise<WrittenLayout> {
  const { header, planned, layout } = planHeader(spec);
  const { open } = await import('node:fs/promises');
  const file = await open(path, 'w');
  try {
    await writeAll(file, header);
    if (!spec.headerOnly) {
      const zeros = new Uint8Array(layout.alignment);
      let pos = layout.tensorDataOffset;
      for (const p of planned) {
        const start = layout.tensorDataOffset + p.relOffset;
        if (start > pos) await writeAll(file, zeros.subarray(0, start - pos));
        for (const piece of tensorPieces(p)) await writeAll(file, piece);
        pos = start + p.byteLength;
      }
      if (layout.fileBytes > pos) await writeAll(file, zeros.subarray(0, layout.fileBytes - pos));
    }
  } finally {
    await file.close();
  }
  return layout;
}

async function writeAll(file: { write(b: Uint8Array, o: number, l: number): Promise<{ bytesWritten: number }> }, bytes: Uint8Array): Promise<void> {
  let off = 0;
  while (off < bytes.length) off += (await file.write(bytes, off, bytes.length - off)).bytesWritten;
}
