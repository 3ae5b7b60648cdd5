// Fragmentation for message carriers with a size limit (a WebRTC data channel: 256 KiB; some
// stacks: 16 KiB). An encoded frame no larger than the limit travels as it is; a larger one
// travels as fragments, each a 20-byte fragment header plus a slice of the frame's bytes:
//
//   off size field
//     0    4 magic "GMSF"
//     4    1 version (1)
//     5    1 flags (bit 0: last fragment)
//     6    2 reserved (zero)
//     8    4 message id (u32, per sender)
//    12    4 fragment index (u32, from 0)
//    16    4 total frame bytes (u32, the same in every fragment)
//    20    … slice
//
// Carriers are ordered and reliable, so fragments of one message arrive in index order; a
// gap, a changed total, or a message that outgrows its total is an error.

import { MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';
import { decodeFrame, HEADER_BYTES, MAX_PAYLOAD_BYTES } from './frame.ts';
import type { Frame } from './frame.ts';

export const FRAGMENT_MAGIC = 0x46534d47; // "GMSF" little-endian
export const FRAGMENT_VERSION = 1;
export const FRAGMENT_HEADER_BYTES = 20;
const FLAG_LAST = 1;
/** Smallest limit that leaves room for a useful slice. */
export const MIN_MESSAGE_LIMIT = 64;
/** Messages being reassembled at once per receiver: carriers send one frame at a time per
 * direction, a few in flight at most; more means a misbehaving peer. */
const MAX_PENDING = 16;

/** What a receiver holds for messages still in reassembly. */
export interface ReassemblyLimits {
  /** the frames announced by the messages in reassembly, summed (bytes; default: one largest frame) */
  maxPendingBytes?: number;
  /** a message whose next fragment has not come for this long is dropped (ms, default 30 s) */
  maxAgeMs?: number;
}

export const REASSEMBLY_DEFAULTS = { maxPendingBytes: HEADER_BYTES + MAX_PAYLOAD_BYTES, maxAgeMs: 30_000 };

function fail(code: ErrorCode, field: string, message: string): never {
  throw new MeshError(code, `fragment ${field}: ${message}`, { field });
}

/** Splits an encoded frame into messages no larger than `limit` bytes. */
export function fragment(encoded: Uint8Array, limit: number, messageId: number): Uint8Array[] {
  if (limit < MIN_MESSAGE_LIMIT) throw new MeshError('FRAGMENT_BAD_LIMIT', `message limit ${limit} is below ${MIN_MESSAGE_LIMIT} bytes`);
  if (encoded.byteLength <= limit) return [encoded];
  const slice = limit - FRAGMENT_HEADER_BYTES;
  const count = Math.ceil(encoded.byteLength / slice);
  const out: Uint8Array[] = [];
  for (let i = 0; i < count; i++) {
    const part = encoded.subarray(i * slice, Math.min(encoded.byteLength, (i + 1) * slice));
    const msg = new Uint8Array(FRAGMENT_HEADER_BYTES + part.byteLength);
    const v = new DataView(msg.buffer);
    v.setUint32(0, FRAGMENT_MAGIC, true);
    v.setUint8(4, FRAGMENT_VERSION);
    v.setUint8(5, i === count - 1 ? FLAG_LAST : 0);
    v.setUint32(8, messageId >>> 0, true);
    v.setUint32(12, i, true);
    v.setUint32(16, encoded.byteLength, true);
    msg.set(part, FRAGMENT_HEADER_BYTES);
    out.push(msg);
  }
  return out;
}

/** Splits outgoing frames, numbering messages itself. */
export class Fragmenter {
  private nextId = 1;
  constructor(readonly limit: number) {}
  split(encoded: Uint8Array): Uint8Array[] {
    const id = this.nextId;
    this.nextId = (this.nextId + 1) >>> 0 || 1;
    return fragment(encoded, this.limit, id);
  }
}

interface Pending {
  total: number;
  nextIndex: number;
  received: number;
  /** the slices so far: memory grows with what arrived, not with what was announced */
  parts: Uint8Array[];
  /** performance.now() of the last fragment */
  lastAt: number;
}

/**
 * Receives messages (whole frames or fragments) and returns whole frames. Bounded: the frames
 * announced by messages in reassembly may sum to `maxPendingBytes` (a message past it is
 * FRAGMENT_TOO_MANY before anything is kept), and a message silent for `maxAgeMs` is dropped.
 */
export class Reassembler {
  private pending = new Map<number, Pending>();
  private readonly limits: Required<ReassemblyLimits>;

  constructor(limits: ReassemblyLimits = {}) {
    this.limits = { ...REASSEMBLY_DEFAULTS, ...limits };
  }

  /** Drops messages whose next fragment is overdue; returns how many. */
  expire(now = performance.now()): number {
    let n = 0;
    for (const [id, p] of this.pending) {
      if (now - p.lastAt > this.limits.maxAgeMs) {
        this.pending.delete(id);
        n++;
      }
    }
    return n;
  }

  /** Bytes of the frames announced by messages in reassembly. */
  get pendingBytes(): number {
    let n = 0;
    for (const p of this.pending.values()) n += p.total;
    return n;
  }

  /** Returns the completed frame, or null while a fragmented frame is still incomplete. */
  push(message: Uint8Array): Frame | null {
    if (message.byteLength >= 4 && new DataView(message.buffer, message.byteOffset, 4).getUint32(0, true) === FRAGMENT_MAGIC) {
      return this.pushFragment(message);
    }
    return decodeFrame(message);
  }

  /** Messages still waiting for fragments (0 after every frame completed). */
  get pendingCount(): number {
    return this.pending.size;
  }

  private pushFragment(msg: Uint8Array): Frame | null {
    if (msg.byteLength < FRAGMENT_HEADER_BYTES) fail('FRAGMENT_TRUNCATED', 'header', `needs ${FRAGMENT_HEADER_BYTES} bytes, got ${msg.byteLength}`);
    const v = new DataView(msg.buffer, msg.byteOffset, FRAGMENT_HEADER_BYTES);
    const version = v.getUint8(4);
    if (version !== FRAGMENT_VERSION) fail('FRAGMENT_BAD_VERSION', 'version', `expected ${FRAGMENT_VERSION}, got ${version}`);
    const flags = v.getUint8(5);
    if (flags & ~FLAG_LAST) fail('FRAGMENT_BAD_FLAGS', 'flags', `unknown bits 0x${flags.toString(16)}`);
    if (v.getUint16(6, true) !== 0) fail('FRAGMENT_BAD_RESERVED', 'reserved', 'bytes 6..7 must be zero');
    const id = v.getUint32(8, true);
    const index = v.getUint32(12, true);
    const total = v.getUint32(16, true);
    const slice = msg.subarray(FRAGMENT_HEADER_BYTES);
    if (total < HEADER_BYTES || total > HEADER_BYTES + MAX_PAYLOAD_BYTES) fail('FRAGMENT_BAD_LENGTH', 'total', `${total} bytes is not a possible frame size`);
    const now = performance.now();
    this.expire(now);
    let p = this.pending.get(id);
    if (!p) {
      if (index !== 0) fail('FRAGMENT_OUT_OF_ORDER', 'index', `message ${id} starts at fragment ${index}, expected 0`);
      if (this.pending.size >= MAX_PENDING) fail('FRAGMENT_TOO_MANY', 'message id', `more than ${MAX_PENDING} messages in reassembly`);
      if (this.pendingBytes + total > this.limits.maxPendingBytes) {
        fail('FRAGMENT_TOO_MANY', 'total', `message ${id} announces ${total} bytes; with ${this.pendingBytes} in reassembly that passes this receiver's ${this.limits.maxPendingBytes}`);
      }
      p = { total, nextIndex: 0, received: 0, parts: [], lastAt: now };
      this.pending.set(id, p);
    }
    p.lastAt = now;
    if (index !== p.nextIndex) fail('FRAGMENT_OUT_OF_ORDER', 'index', `message ${id}: expected fragment ${p.nextIndex}, got ${index}`);
    if (total !== p.total) fail('FRAGMENT_BAD_LENGTH', 'total', `message ${id}: total changed from ${p.total} to ${total}`);
    if (p.received + slice.byteLength > total) fail('FRAGMENT_BAD_LENGTH', 'total', `message ${id}: fragments exceed ${total} bytes`);
    if (slice.byteLength === 0) fail('FRAGMENT_BAD_LENGTH', 'slice', `message ${id}: empty fragment ${index}`);
    p.parts.push(slice.slice());
    p.received += slice.byteLength;
    p.nextIndex++;
    const last = (flags & FLAG_LAST) !== 0;
    if (!last) {
      if (p.received === total) fail('FRAGMENT_BAD_LENGTH', 'flags', `message ${id}: all ${total} bytes arrived but fragment ${index} is not marked last`);
      return null;
    }
    this.pending.delete(id);
    if (p.received !== total) fail('FRAGMENT_TRUNCATED', 'total', `message ${id}: last fragment leaves ${total - p.received} of ${total} bytes missing`);
    const bytes = new Uint8Array(total);
    let at = 0;
    for (const part of p.parts) {
      bytes.set(part, at);
      at += part.byteLength;
    }
    return decodeFrame(bytes);
  }
}
