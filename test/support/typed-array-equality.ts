// toEqual on typed arrays, element by element with Object.is as vitest's own equality does, in
// a plain loop: vitest's generic walk takes ~10 s per million elements, and this suite compares
// logits, hidden rows and KV bytes of that size for exact equality. Registered for every test file.
import { expect } from 'vitest';

/** Any typed array (Uint8Array … BigInt64Array), indexable by element. */
type Typed = ArrayBufferView & ArrayLike<number | bigint>;

const isTyped = (x: unknown): x is Typed => ArrayBuffer.isView(x) && !(x instanceof DataView);

function typedArraysEqual(a: unknown, b: unknown): boolean | undefined {
  if (!isTyped(a) || !isTyped(b)) return undefined; // not ours: vitest decides
  if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b) || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return false;
  return true;
}

expect.addEqualityTesters([typedArraysEqual]);
