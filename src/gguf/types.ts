// Shared shapes of a parsed GGUF artifact. Everything that reads, writes or computes with
// GGUF tensors speaks in these types.

import { MeshError } from '../errors.ts';

/** ggml tensor type ids, as stored in a GGUF tensor info (ggml.h `enum ggml_type`). */
export enum GgmlType {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
}

/** Block geometry of a ggml type: `blockSize` elements are stored in `typeSize` bytes. */
export interface TypeTraits {
  name: string;
  /** elements per block */
  blockSize: number;
  /** bytes per block */
  typeSize: number;
}

// Every type a GGUF may hold: also those we cannot dequantise, so their tensors can still be
// located, hashed and shipped.
export const TYPE_TRAITS: Partial<Record<GgmlType, TypeTraits>> = {
  [GgmlType.F32]: { name: 'F32', blockSize: 1, typeSize: 4 },
  [GgmlType.F16]: { name: 'F16', blockSize: 1, typeSize: 2 },
  [GgmlType.BF16]: { name: 'BF16', blockSize: 1, typeSize: 2 },
  [GgmlType.Q4_0]: { name: 'Q4_0', blockSize: 32, typeSize: 18 },
  [GgmlType.Q4_1]: { name: 'Q4_1', blockSize: 32, typeSize: 20 },
  [GgmlType.Q5_0]: { name: 'Q5_0', blockSize: 32, typeSize: 22 },
  [GgmlType.Q5_1]: { name: 'Q5_1', blockSize: 32, typeSize: 24 },
  [GgmlType.Q8_0]: { name: 'Q8_0', blockSize: 32, typeSize: 34 },
  [GgmlType.Q8_1]: { name: 'Q8_1', blockSize: 32, typeSize: 36 },
  [GgmlType.Q2_K]: { name: 'Q2_K', blockSize: 256, typeSize: 84 },
  [GgmlType.Q3_K]: { name: 'Q3_K', blockSize: 256, typeSize: 110 },
  [GgmlType.Q4_K]: { name: 'Q4_K', blockSize: 256, typeSize: 144 },
  [GgmlType.Q5_K]: { name: 'Q5_K', blockSize: 256, typeSize: 176 },
  [GgmlType.Q6_K]: { name: 'Q6_K', blockSize: 256, typeSize: 210 },
  [GgmlType.Q8_K]: { name: 'Q8_K', blockSize: 256, typeSize: 292 },
  [GgmlType.IQ2_XXS]: { name: 'IQ2_XXS', blockSize: 256, typeSize: 66 },
  [GgmlType.IQ2_XS]: { name: 'IQ2_XS', blockSize: 256, typeSize: 74 },
  [GgmlType.IQ3_XXS]: { name: 'IQ3_XXS', blockSize: 256, typeSize: 98 },
  [GgmlType.IQ1_S]: { name: 'IQ1_S', blockSize: 256, typeSize: 50 },
  [GgmlType.IQ3_S]: { name: 'IQ3_S', blockSize: 256, typeSize: 110 },
  [GgmlType.IQ2_S]: { name: 'IQ2_S', blockSize: 256, typeSize: 82 },
  [GgmlType.IQ1_M]: { name: 'IQ1_M', blockSize: 256, typeSize: 56 },
  [GgmlType.TQ1_0]: { name: 'TQ1_0', blockSize: 256, typeSize: 54 },
  [GgmlType.TQ2_0]: { name: 'TQ2_0', blockSize: 256, typeSize: 66 },
  [GgmlType.IQ4_NL]: { name: 'IQ4_NL', blockSize: 32, typeSize: 18 },
  [GgmlType.IQ4_XS]: { name: 'IQ4_XS', blockSize: 256, typeSize: 136 },
  [GgmlType.I8]: { name: 'I8', blockSize: 1, typeSize: 1 },
  [GgmlType.I16]: { name: 'I16', blockSize: 1, typeSize: 2 },
  [GgmlType.I32]: { name: 'I32', blockSize: 1, typeSize: 4 },
  [GgmlType.I64]: { name: 'I64', blockSize: 1, typeSize: 8 },
  [GgmlType.F64]: { name: 'F64', blockSize: 1, typeSize: 8 },
  [GgmlType.MXFP4]: { name: 'MXFP4', blockSize: 32, typeSize: 17 },
};

export function typeName(type: number): string {
  return TYPE_TRAITS[type as GgmlType]?.name ?? `unknown(${type})`;
}

/** Bytes a tensor of `type` with `nElements` elements occupies. Throws on a partial block. */
export function tensorBytes(type: GgmlType, nElements: number): number {
  const t = TYPE_TRAITS[type];
  if (!t) throw new MeshError('GGUF_UNKNOWN_TYPE', `unknown tensor type ${type}`);
  if (nElements % t.blockSize !== 0) {
    throw new MeshError('BAD_TENSOR_SIZE', `${nElements} elements is not a whole number of ${t.name} blocks of ${t.blockSize}`);
  }
  return (nElements / t.blockSize) * t.typeSize;
}

/** One tensor of an artifact with its absolute location in the file. */
export interface TensorInfo {
  name: string;
  type: GgmlType;
  /** ggml order: shape[0] (ne0) is the contiguous, fastest-varying dimension */
  shape: number[];
  /** element count (product of shape) */
  nElements: number;
  /** absolute byte offset of the tensor's data from the start of the file */
  offset: number;
  /** bytes of the tensor's data */
  byteLength: number;
}

export type MetadataValue = string | number | bigint | boolean | MetadataValue[];

/** A metadata entry's GGUF value type, as the writer names it: a scalar kind, or `array:<item kind>`. */
export type MetadataTypeName = string;

/** A parsed GGUF header: metadata, tensor infos with absolute byte ranges, and file geometry. */
export interface GgufHeader {
  version: number;
  metadata: Record<string, MetadataValue>;
  tensors: TensorInfo[];
  /** absolute byte offset where tensor data begins (aligned) */
  tensorDataOffset: number;
  /** alignment of tensor data (general.alignment, default 32) */
  alignment: number;
  /** total bytes of the file (or of the remote object) */
  fileBytes: number;
  /**
   * each metadata key's GGUF value type ('uint32', 'float32', 'array:int32', …) where the parser
   * knew it: rewriting a header (a shard GGUF for llama.cpp) must keep them, as llama.cpp checks
   * key types
   */
  metadataTypes?: Record<string, MetadataTypeName>;
}

/** A byte range in a file: `[offset, offset + length)`. */
export interface ByteRange {
  offset: number;
  length: number;
}

/**
 * Where tensor bytes come from: a parsed header plus a way to read any set of its tensors
 * (from a local file, or from a URL by coalesced HTTP Range requests).
 */
export interface TensorSource {
  readonly header: GgufHeader;
  /** human-readable location (path or URL) for error messages */
  readonly location: string;
  /** read the data of these tensors; the map is keyed by tensor name */
  read(tensors: readonly TensorInfo[]): Promise<Map<string, Uint8Array>>;
  close(): Promise<void>;
}

/** Layers [start, end) of an artifact; the embedding rides along when start == 0, the output
 * norm and head when end == nLayer. */
export interface ShardRange {
  start: number;
  end: number;
}
