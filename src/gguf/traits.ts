// Block geometry for every ggml type a GGUF may hold. TYPE_TRAITS (types.ts) covers the
// types we compute with; the i-quants and ternary types below we cannot dequantise, but we
// can still locate, hash and ship their bytes. Browser-safe (no node imports).

import { GgmlType, TYPE_TRAITS } from './types.ts';
import type { TypeTraits } from './types.ts';

const EXTRA_TRAITS: Partial<Record<GgmlType, TypeTraits>> = {
  [GgmlType.IQ2_XXS]: { name: 'IQ2_XXS', blockSize: 256, typeSize: 66 },
  [GgmlType.IQ2_XS]: { name: 'IQ2_XS', blockSize: 256, typeSize: 74 },
  [GgmlType.IQ3_XXS]: { name: 'IQ3_XXS', blockSize: 256, typeSize: 98 },
  [GgmlType.IQ1_S]: { name: 'IQ1_S', blockSize: 256, typeSize: 50 },
  [GgmlType.IQ3_S]: { name: 'IQ3_S', blockSize: 256, typeSize: 110 },
  [GgmlType.IQ2_S]: { name: 'IQ2_S', blockSize: 256, typeSize: 82 },
  [GgmlType.IQ1_M]: { name: 'IQ1_M', blockSize: 256, typeSize: 56 },
  [GgmlType.TQ1_0]: { name: 'TQ1_0', blockSize: 256, typeSize: 54 },
  [GgmlType.TQ2_0]: { name: 'TQ2_0', blockSize: 256, typeSize: 66 },
};

/** Block geometry of any ggml type a GGUF may hold, or undefined for an unknown id. */
export function traitsOf(type: number): TypeTraits | undefined {
  return TYPE_TRAITS[type as GgmlType] ?? EXTRA_TRAITS[type as GgmlType];
}

/** The type's name (e.g. 'Q4_K'), or `unknown(N)`. */
export function ggmlTypeName(type: number): string {
  return traitsOf(type)?.name ?? `unknown(${type})`;
}
