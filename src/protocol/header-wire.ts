// A GGUF header as JSON, for peers that must not read model bytes they will not compute with.
// The signaling server has parsed the header already; it hands peers this form (metadata
// without the tokenizer's big arrays, which stages never use; bigints as numbers), and a
// peer rebuilds the GgufHeader its backend wants. Tensor offsets and sizes still come from
// the manifest the peer verifies against.

import { MeshError } from '../errors.ts';
import type { GgufHeader, MetadataValue, TensorInfo } from '../gguf/types.ts';

export interface WireHeader {
  version: number;
  metadata: Record<string, WireValue>;
  tensors: TensorInfo[];
  tensorDataOffset: number;
  alignment: number;
  fileBytes: number;
  /** GGUF value type of each metadata key sent (a peer rewriting the header keeps them) */
  metadataTypes?: Record<string, string>;
}

type WireValue = string | number | boolean | WireValue[];

/** Metadata arrays longer than this are dropped (token lists, merges, scores): stages never read them. */
export const MAX_WIRE_ARRAY = 4096;

function toWire(v: MetadataValue): WireValue {
  if (typeof v === 'bigint') return Number(v);
  if (Array.isArray(v)) return v.map(toWire);
  return v;
}

export function headerToWire(h: GgufHeader): WireHeader {
  const metadata: Record<string, WireValue> = {};
  const metadataTypes: Record<string, string> = {};
  for (const [k, v] of Object.entries(h.metadata)) {
    if (Array.isArray(v) && v.length > MAX_WIRE_ARRAY) continue;
    metadata[k] = toWire(v);
    const type = h.metadataTypes?.[k];
    if (type) metadataTypes[k] = type;
  }
  return { version: h.version, metadata, metadataTypes, tensors: h.tensors.map((t) => ({ ...t, shape: [...t.shape] })), tensorDataOffset: h.tensorDataOffset, alignment: h.alignment, fileBytes: h.fileBytes };
}

export function headerFromWire(input: unknown): GgufHeader {
  const w = input as Partial<WireHeader> | null;
  if (!w || typeof w !== 'object' || typeof w.metadata !== 'object' || !Array.isArray(w.tensors) || !Number.isSafeInteger(w.fileBytes)) {
    throw new MeshError('BAD_HEADER', 'the model header from the server lacks metadata, tensors or fileBytes');
  }
  for (const t of w.tensors) {
    if (typeof t.name !== 'string' || !Number.isSafeInteger(t.offset) || !Number.isSafeInteger(t.byteLength) || !Array.isArray(t.shape)) {
      throw new MeshError('BAD_HEADER', `the model header's entry for tensor '${String(t?.name)}' is malformed`);
    }
  }
  return {
    version: Number(w.version ?? 3),
    metadata: w.metadata as Record<string, MetadataValue>,
    tensors: w.tensors,
    tensorDataOffset: Number(w.tensorDataOffset ?? 0),
    alignment: Number(w.alignment ?? 32),
    fileBytes: w.fileBytes!,
    ...(w.metadataTypes && typeof w.metadataTypes === 'object' ? { metadataTypes: w.metadataTypes } : {}),
  };
}
