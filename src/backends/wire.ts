// Errors and results as they cross a worker boundary (comlink): plain {name, code, message,
// details}, made MeshErrors again on the other side, so codes survive the thread hop. The
// WebGPU worker and every stage worker (worker-api.ts) answer every call with a WireResult.

import { MeshError } from '../errors.ts';
import type { ErrorCode } from '../error-codes.ts';

/** An error as it travels between threads. */
export interface WireError {
  name: string;
  code: string;
  message: string;
  details?: Record<string, unknown>;
}

export type WireResult<T> = { ok: true; value: T } | { ok: false; error: WireError };

/** `e` for the wire; anything but a MeshError gets `fallback` as its code */
export function toWireError(e: unknown, fallback: ErrorCode): WireError {
  if (e instanceof MeshError) return { name: e.name, code: e.code, message: e.message, details: e.details };
  if (e instanceof Error) return { name: e.name, code: fallback, message: e.message };
  return { name: 'Error', code: fallback, message: String(e) };
}

export function fromWire<T>(r: WireResult<T>): T {
  if (r.ok) return r.value;
  throw MeshError.fromWire(r.error.code, r.error.message, r.error.details);
}

/** runs fn and answers its result or its error as a WireResult */
export async function wireCall<T>(fn: () => Promise<T> | T, fallback: ErrorCode): Promise<WireResult<T>> {
  try {
    return { ok: true, value: await fn() };
  } catch (e) {
    return { ok: false, error: toWireError(e, fallback) };
  }
}
