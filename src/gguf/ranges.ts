// Coalescing of byte ranges: many small tensor ranges become few reads (or HTTP Range
// requests). Ranges closer than `maxGap` bytes merge, reading the gap and discarding it, as
// long as the merged read stays under `maxLength`.

import type { ByteRange } from './types.ts';
import { MeshError } from '../errors.ts';

/** One read that covers several requested ranges. */
export interface CoalescedRange extends ByteRange {
  /** the requested ranges it covers: index into the input, and offset relative to this read */
  parts: { index: number; relOffset: number; length: number }[];
}

export interface CoalesceOptions {
  /** merge ranges separated by at most this many bytes (default 64 KiB) */
  maxGap?: number;
  /** never grow one read past this many bytes, unless a single range is larger (default 64 MiB) */
  maxLength?: number;
}

export const DEFAULT_MAX_GAP = 64 * 1024;
export const DEFAULT_MAX_LENGTH = 64 * 1024 * 1024;

/** Groups ranges (any order, overlaps allowed) into reads sorted by offset. */
export function coalesceRanges(ranges: readonly ByteRange[], opts: CoalesceOptions = {}): CoalescedRange[] {
  const maxGap = opts.maxGap ?? DEFAULT_MAX_GAP;
  const maxLength = opts.maxLength ?? DEFAULT_MAX_LENGTH;
  const order = ranges
    .map((r, index) => ({ ...r, index }))
    .sort((a, b) => a.offset - b.offset || a.length - b.length);
  const out: CoalescedRange[] = [];
  let cur: CoalescedRange | undefined;
  let curEnd = 0;
  for (const r of order) {
    if (r.offset < 0 || r.length < 0 || !Number.isSafeInteger(r.offset + r.length)) {
      throw new MeshError('BAD_BYTE_RANGE', `invalid byte range [${r.offset}, +${r.length})`);
    }
    const end = r.offset + r.length;
    const mergedEnd = Math.max(curEnd, end);
    if (cur && r.offset <= curEnd + maxGap && mergedEnd - cur.offset <= maxLength) {
      curEnd = mergedEnd;
      cur.length = curEnd - cur.offset;
    } else {
      cur = { offset: r.offset, length: r.length, parts: [] };
      curEnd = end;
      out.push(cur);
    }
    cur.parts.push({ index: r.index, relOffset: r.offset - cur.offset, length: r.length });
  }
  return out;
}
