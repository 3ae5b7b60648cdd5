// ggml itself, as an oracle for dequantisation and quantisation: binds with koffi to the
// libggml-base.so that node-llama-cpp ships (the same code llama.cpp runs), and calls
// `ggml_get_type_traits(type)->to_float` and `ggml_quantize_chunk`.
//
//   ggmlDequantize(type, bytes, n) → Float32Array   ggml's reference to_float
//   ggmlQuantize(type, f32, nRows, nPerRow) → bytes  ggml_quantize_chunk (no importance matrix)
//   ggmlTypeSize(type) / ggmlBlockSize(type)         block geometry as ggml knows it
import koffi from 'koffi';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from './cli.ts';
import type { GgmlType } from '../../src/gguf/types.ts';

function findBinsDir(): string {
  const root = join(REPO_ROOT, 'node_modules', '@node-llama-cpp', 'linux-x64', 'bins');
  const candidates = [root, ...(existsSync(root) ? readdirSync(root).map((d) => join(root, d)) : [])];
  const dir = candidates.find((d) => existsSync(join(d, 'libggml-base.so')));
  if (!dir) throw new Error(`libggml-base.so not found under ${root}: is node-llama-cpp (with @node-llama-cpp/linux-x64) installed?`);
  return dir;
}

export const GGML_BINS_DIR = findBinsDir();

const lib = koffi.load(join(GGML_BINS_DIR, 'libggml-base.so'));

// ggml.h `struct ggml_type_traits` (function pointers kept as opaque pointers)
const TypeTraits = koffi.struct('ggml_type_traits', {
  type_name: 'const char *',
  blck_size: 'int64_t',
  blck_size_interleave: 'int64_t',
  type_size: 'size_t',
  is_quantized: 'bool',
  to_float: 'void *',
  from_float_ref: 'void *',
});
const ToFloat = koffi.proto('void ggml_to_float_t(const void *x, float *y, int64_t k)');

const getTypeTraits = lib.func('ggml_get_type_traits', koffi.pointer(TypeTraits), ['int']);
const quantizeChunk = lib.func(
  'size_t ggml_quantize_chunk(int type, const float *src, void *dst, int64_t start, int64_t nrows, int64_t n_per_row, const float *imatrix)',
);
const rowSize = lib.func('size_t ggml_row_size(int type, int64_t ne)');

interface Traits {
  type_name: string;
  blck_size: number | bigint;
  type_size: number | bigint;
  is_quantized: boolean;
  to_float: unknown;
}

function traits(type: GgmlType): Traits {
  const p = getTypeTraits(type);
  if (!p) throw new Error(`ggml has no traits for type ${type}`);
  return koffi.decode(p, TypeTraits) as Traits;
}

export function ggmlTypeName(type: GgmlType): string {
  return traits(type).type_name;
}
export function ggmlBlockSize(type: GgmlType): number {
  return Number(traits(type).blck_size);
}
export function ggmlTypeSize(type: GgmlType): number {
  return Number(traits(type).type_size);
}

/** ggml's own dequantisation of `n` elements of `type` stored in `bytes`. */
export function ggmlDequantize(type: GgmlType, bytes: Uint8Array, n: number): Float32Array {
  const t = traits(type);
  // ggml converts F32 to float by copying (it has no to_float for it)
  if (type === 0) return new Float32Array(bytes.slice(0, n * 4).buffer);
  if (!t.to_float) throw new Error(`ggml has no to_float for ${t.type_name}`);
  const need = Number(rowSize(type, n));
  if (bytes.length < need) throw new Error(`${n} ${t.type_name} elements need ${need} bytes, got ${bytes.length}`);
  const out = new Float32Array(n); // [n] f32
  koffi.call(t.to_float, ToFloat, bytes, out, n);
  return out;
}

/** ggml_quantize_chunk over a [nRows × nPerRow] f32 matrix; returns the quantised bytes. */
export function ggmlQuantize(type: GgmlType, f32: Float32Array, nRows: number, nPerRow: number): Uint8Array {
  if (f32.length < nRows * nPerRow) throw new Error(`need ${nRows * nPerRow} floats, got ${f32.length}`);
  const size = Number(rowSize(type, nPerRow)) * nRows;
  const dst = new Uint8Array(size);
  const written = Number(quantizeChunk(type, f32, dst, 0, nRows, nPerRow, null));
  if (written !== size) throw new Error(`ggml_quantize_chunk wrote ${written} bytes, expected ${size}`);
  return dst;
}
