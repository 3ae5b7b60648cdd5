// Runtime checks of wire input against schemas (valibot: small, tree-shaken in the page's bundle,
// and its schemas are plain objects a fuzzer can walk). Every control message, session-open body
// and API request body is parsed here before a handler reads a field; a bad one is a MeshError
// naming the field, never a TypeError further in.

import * as v from 'valibot';
import { MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';

export type Schema<T = unknown> = v.GenericSchema<unknown, T>;

/** Parses `input` with `schema`; the first problem is a `code` error: "`what`: `field`: what was wrong". */
export function validate<T>(schema: Schema<T>, input: unknown, what: string, code: ErrorCode = 'BAD_MESSAGE'): T {
  // valibot's object schemas take an array as an object with no fields; a body is never one
  if (Array.isArray(input) && (schema as { type?: string }).type === 'object') throw new MeshError(code, `${what}: expected an object, got an array`, { field: '(whole)' });
  const r = v.safeParse(schema, input, { abortEarly: true });
  if (r.success) return r.output;
  const issue = r.issues[0];
  const field = v.getDotPath(issue) ?? '';
  throw new MeshError(code, `${what}${field ? `: ${field}` : ''}: ${issue.message}`, { field: field || '(whole)' });
}

/** JSON text of at most `maxBytes` (UTF-16 units, a cheap upper bound check first), parsed. */
export function parseJsonText(text: string, maxChars: number, what: string, code: ErrorCode = 'BAD_MESSAGE'): unknown {
  if (text.length > maxChars) throw new MeshError(code, `${what}: ${text.length} characters exceeds the limit of ${maxChars}`, { field: '(whole)' });
  try {
    return JSON.parse(text);
  } catch {
    throw new MeshError(code, `${what}: not JSON`, { field: '(whole)' });
  }
}

// ---- field schemas every message uses

export const u32 = v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0xffffffff));
/** a count or size in bytes: a non-negative integer below 2^53 */
export const count = v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(Number.MAX_SAFE_INTEGER));
export const finiteNumber = v.pipe(v.number(), v.finite());
export const text = (max: number) => v.pipe(v.string(), v.maxLength(max));
export const list = <T>(item: Schema<T>, max: number) => v.pipe(v.array(item), v.maxLength(max));
/** a plain JSON object (e.g. a WebRTC signal), contents unchecked; bounded by the message size */
export const plainObject = v.custom<Record<string, unknown>>((x) => typeof x === 'object' && x !== null && !Array.isArray(x), 'expected an object');
