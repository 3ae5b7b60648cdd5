// A GGUF weight matrix on the GPU, stored exactly as the file's blocks (no f32 copy), split
// by rows into several buffers when it is larger than one storage binding may be.

import { MeshError } from '../../errors.ts';
import { TYPE_TRAITS } from '../../gguf/types.ts';
import type { GgmlType } from '../../gguf/types.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { quantKindOf } from './shader-library.ts';
import type { QuantKind } from './shader-library.ts';

export interface MatrixChunk {
  buffer: GPUBuffer; // [rows × rowBytes] GGUF blocks
  /** index of the chunk's first row in the whole matrix */
  row0: number;
  rows: number;
}

export interface GpuMatrix {
  name: string;
  type: GgmlType;
  quant: QuantKind;
  /** elements per row (ggml ne0) */
  k: number;
  /** rows (ggml ne1) */
  rows: number;
  /** bytes per row */
  rowBytes: number;
  chunks: MatrixChunk[];
}

/**
 * Uploads a 2-D tensor `[k, rows]` (ggml order) given its raw bytes. Rows are split over
 * buffers of at most `maxChunkBytes` each.
 */
export function uploadMatrix(
  memory: GpuMemory,
  name: string,
  type: GgmlType,
  shape: readonly number[],
  bytes: Uint8Array,
  maxChunkBytes: number,
): GpuMatrix {
  const quant = quantKindOf(type, name);
  const traits = TYPE_TRAITS[type]!;
  const k = shape[0]!;
  const rows = shape.slice(1).reduce((a, b) => a * b, 1);
  if (k % traits.blockSize !== 0 || k % 4 !== 0) {
    throw new MeshError('BAD_TENSOR_SHAPE', `${name}: row length ${k} is not a multiple of ${Math.max(4, traits.blockSize)} (${traits.name} blocks)`);
  }
  const rowBytes = (k / traits.blockSize) * traits.typeSize;
  if (bytes.byteLength !== rowBytes * rows) {
    throw new MeshError('BAD_TENSOR_DATA', `${name}: expected ${rowBytes * rows} bytes for ${rows} rows of ${k} ${traits.name}, got ${bytes.byteLength}`);
  }
  const rowsPerChunk = Math.floor(maxChunkBytes / rowBytes);
  if (rowsPerChunk < 1) {
    throw new MeshError('TENSOR_TOO_LARGE', `${name}: one row (${rowBytes} bytes) exceeds the storage binding limit of ${maxChunkBytes} bytes`);
  }
  const chunks: MatrixChunk[] = [];
  for (let row0 = 0; row0 < rows; row0 += rowsPerChunk) {
    const n = Math.min(rowsPerChunk, rows - row0);
    const part = bytes.subarray(row0 * rowBytes, (row0 + n) * rowBytes);
    chunks.push({ buffer: memory.upload(`${name}[${row0}..${row0 + n})`, part), row0, rows: n });
  }
  return { name, type, quant, k, rows, rowBytes, chunks };
}

export function destroyMatrix(memory: GpuMemory, m: GpuMatrix | undefined): void {
  if (!m) return;
  for (const c of m.chunks) memory.destroy(c.buffer);
}
