// Lookups over TYPE_TRAITS (types.ts) that accept any number read from a file.
// Browser-safe (no node imports).

import { TYPE_TRAITS, typeName } from './types.ts';
import type { GgmlType, TypeTraits } from './types.ts';

/** Block geometry of any ggml type a GGUF may hold, or undefined for an unknown id. */
export function traitsOf(type: number): TypeTraits | undefined {
  return TYPE_TRAITS[type as GgmlType];
}

/** The type's name (e.g. 'Q4_K'), or `unknown(N)`. */
export const ggmlTypeName = typeName;
