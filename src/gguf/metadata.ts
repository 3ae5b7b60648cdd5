// Typed reads of GGUF metadata values. GGUF stores integers at their written width, so a
// count may arrive as a number (≤ 32 bits, floats) or a bigint (64-bit); readers want numbers.

import { MeshError } from '../errors.ts';
import type { GgufHeader, MetadataValue } from './types.ts';

/** A number or bigint value as a number; undefined for anything else (strings, arrays, absent). */
export function metadataNumber(v: MetadataValue | undefined): number | undefined {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  return undefined;
}

/** general.architecture; GGUF_MISSING_METADATA naming `location` when it is absent or not a string. */
export function architectureOf(header: GgufHeader, location: string): string {
  const arch = header.metadata['general.architecture'];
  if (typeof arch !== 'string') {
    throw new MeshError('GGUF_MISSING_METADATA', `${location}: no general.architecture in the metadata`);
  }
  return arch;
}

/** The number at `key`, read with `read`; GGUF_MISSING_METADATA naming the key when there is none. */
export function requiredNumber(
  header: GgufHeader,
  key: string,
  location: string,
  read: (v: MetadataValue | undefined) => number | undefined = metadataNumber,
): number {
  const v = read(header.metadata[key]);
  if (v === undefined) throw new MeshError('GGUF_MISSING_METADATA', `${location}: no ${key} in the metadata`);
  return v;
}
