// A 3-D expert tensor [k, rows, nExpert] (ggml order) on the GPU, stored as the GGUF's own
// blocks and split into buffers on expert boundaries, so each expert's rows sit in one binding
// and the expert kernels address expert e at ((e − e0) · rows + row) · rowBytes.

import { MeshError } from '../../errors.ts';
import { TYPE_TRAITS } from '../../gguf/types.ts';
import type { GgmlType } from '../../gguf/types.ts';
import type { GpuMemory } from './gpu-memory.ts';
import { quantKindOf } from './shader-library.ts';
import type { QuantKind } from './shader-library.ts';

export interface ExpertChunk {
  buffer: GPUBuffer; // [experts × rows × rowBytes] GGUF blocks
  /** first expert in this buffer */
  e0: number;
  experts: number;
}

export interface GpuExperts {
  name: string;
  type: GgmlType;
  quant: QuantKind;
  /** elements per row (ggml ne0) */
  k: number;
  /** rows of one expert (ggml ne1) */
  expertRows: number;
  nExpert: number;
  rowBytes: number;
  chunks: ExpertChunk[];
}

/** Uploads an expert tensor of `shape` [k, rows, nExpert], experts split over buffers of at most maxChunkBytes. */
export function uploadExperts(memory: GpuMemory, name: string, type: GgmlType, shape: readonly number[], bytes: Uint8Array, maxChunkBytes: number): GpuExperts {
  const quant = quantKindOf(type, name);
  const traits = TYPE_TRAITS[type]!;
  const [k, rows, nExpert] = shape as [number, number, number];
  if (shape.length !== 3 || k % traits.blockSize !== 0 || k % 4 !== 0) {
    throw new MeshError('BAD_TENSOR_SHAPE', `${name}: expected [k, rows, experts] with k a multiple of ${Math.max(4, traits.blockSize)}, got [${shape.join(', ')}]`);
  }
  const rowBytes = (k / traits.blockSize) * traits.typeSize;
  const expertBytes = rows * rowBytes;
  if (bytes.byteLength !== expertBytes * nExpert) {
    throw new MeshError('BAD_TENSOR_DATA', `${name}: expected ${expertBytes * nExpert} bytes for ${nExpert} experts of ${rows} rows, got ${bytes.byteLength}`);
  }
  const perChunk = Math.floor(maxChunkBytes / expertBytes);
  if (perChunk < 1) {
    throw new MeshError('TENSOR_TOO_LARGE', `${name}: one expert (${expertBytes} bytes) exceeds the storage binding limit of ${maxChunkBytes} bytes`);
  }
  const chunks: ExpertChunk[] = [];
  for (let e0 = 0; e0 < nExpert; e0 += perChunk) {
    const n = Math.min(perChunk, nExpert - e0);
    chunks.push({ buffer: memory.upload(`${name}[experts ${e0}..${e0 + n})`, bytes.subarray(e0 * expertBytes, (e0 + n) * expertBytes)), e0, experts: n });
  }
  return { name, type, quant, k, expertRows: rows, nExpert, rowBytes, chunks };
}

export function destroyExperts(memory: GpuMemory, e: GpuExperts | undefined): void {
  if (!e) return;
  for (const c of e.chunks) memory.destroy(c.buffer);
}
