// The one binary frame every carrier (WebSocket, HTTP, WebRTC data channel) moves between a
// client, the stages of a route and the signaling server. docs/protocol.md is the byte-level
// specification; this file is its executable form. All integers are little-endian.
//
//   off size field
//     0    4 magic "GMSH"
//     4    1 version (1)
//     5    1 type (FrameType)
//     6    2 flags (FrameFlag bits; unknown bits are an error)
//     8    4 route id (u32)
//    12   16 session id (128-bit random)
//    28    4 sequence number (u32; a reply repeats its request's)
//    32    4 start position (u32; first position of the tokens in this frame)
//    36    4 token count (u32)
//    40    1 dtype (DType)
//    41    3 reserved (zero)
//    44    4 width (u32; elements per token row: 1 for token ids, n_embd for hidden states)
//    48    4 payload length (u32, bytes)
//    52    … payload

import { MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';

export const FRAME_MAGIC = 0x48534d47; // "GMSH" read as a little-endian u32
export const FRAME_VERSION = 1;
export const HEADER_BYTES = 52;

/** Largest payload a peer accepts (bytes): a 4096-token prefill chunk of a 16384-wide model
 * in f32 is 256 MiB; anything larger is a corrupt length, refused before allocating. */
export const MAX_PAYLOAD_BYTES = 256 * 1024 * 1024;
/** Widest token row (elements): above any released model's n_embd or n_vocab. */
export const MAX_WIDTH = 1 << 20;
/** Most tokens in one frame: far above a sensible prefill chunk. */
export const MAX_TOKENS = 1 << 16;
/** Most top log-probabilities a Token frame carries (OpenAI's top_logprobs limit). */
export const MAX_TOP_LOGPROBS = 20;
/** Largest JSON payload (bytes): control messages are small. */
export const MAX_JSON_BYTES = 1 << 20;

export enum FrameType {
  SessionOpen = 1,
  SessionClose = 2,
  Prefill = 3,
  Decode = 4,
  Hidden = 5,
  Token = 6,
  Status = 7,
  Error = 8,
  Logits = 9,
  /** server → stage: drop the session's positions from `position` on (KV cache, output log), and reset the sampler to the draws in the JSON body */
  Rewind = 10,
  /** server → stage: send the hidden states this stage logged for positions [position, body.end) to its next stage again, as Replay frames */
  Resend = 11,
}

export enum FrameFlag {
  /** the last stage samples after this chunk and answers with a Token frame */
  Sample = 1 << 0,
  /** this frame answers the request that had the same sequence number */
  Reply = 1 << 1,
  /** the last stage answers with a Logits frame instead of sampling */
  WantLogits = 1 << 2,
  /** request: every stage appends its step timing to the reply */
  WantTimings = 1 << 3,
  /** the payload ends with a timing trailer (see TIMING_RECORD_BYTES) */
  Timings = 1 << 4,
  /** a repair replay: the stage computes (filling its KV cache and output log) and answers Status; nothing goes downstream, nothing is sampled */
  Replay = 1 << 5,
  /**
   * the one-way token path: the last stage sends its Token/Logits answer straight to the
   * session's owner (the server's session manager, as a `return` control message) instead of
   * back up the chain, and answers the stage before it with a Status; stages before it pass
   * the flag on, and with WantTimings carry their timing records forward on the Hidden frame
   */
  ReturnDirect = 1 << 6,
  /**
   * speculative decoding: a sampled Prefill of n tokens whose tokens after the first are drafts.
   * Every stage first drops the positions from the frame's start on that an earlier Verify
   * frame wrote past its first token (the drafts the session manager rejected), then computes
   * as usual; the last stage answers with a Token frame of n tokens (this flag set): the greedy
   * token after each of the frame's positions
   */
  Verify = 1 << 7,
  /**
   * the ring (with ReturnDirect, on a Decode and the Hidden frames it makes): the last stage
   * also sends its sampled Token straight to stage 0, where the session manager has already
   * sent the next step as an AwaitsToken Decode — so the next step starts there, not a server
   * round trip later
   */
  Ring = 1 << 8,
  /** a Decode sent ahead on the ring: its token is the one the last stage samples for this position and sends stage 0 (the payload's is ignored) */
  AwaitsToken = 1 << 9,
}
const KNOWN_FLAGS = FrameFlag.Sample | FrameFlag.Reply | FrameFlag.WantLogits | FrameFlag.WantTimings | FrameFlag.Timings | FrameFlag.Replay | FrameFlag.ReturnDirect | FrameFlag.Verify | FrameFlag.Ring | FrameFlag.AwaitsToken;

/** One stage's step timing in a trailer: 8 u32 (see docs/protocol.md). */
export const TIMING_RECORD_BYTES = 32;
/** Most records in a trailer: one per stage of a route. */
export const MAX_TIMING_RECORDS = 255;

export enum DType {
  None = 0,
  F32 = 1,
  F16 = 2,
  I32 = 3,
  Json = 4,
}

const DTYPE_BYTES: Record<number, number> = { [DType.F32]: 4, [DType.F16]: 2, [DType.I32]: 4 };

/** Which dtypes each frame type may carry, and whether its width is fixed. */
const TYPE_RULES: Record<FrameType, { dtypes: DType[]; width?: number; tokens?: 'one' | 'some' | 'zero' }> = {
  [FrameType.SessionOpen]: { dtypes: [DType.Json], width: 0, tokens: 'zero' },
  [FrameType.SessionClose]: { dtypes: [DType.None], width: 0, tokens: 'zero' },
  [FrameType.Prefill]: { dtypes: [DType.I32], width: 1, tokens: 'some' },
  [FrameType.Decode]: { dtypes: [DType.I32], width: 1, tokens: 'one' },
  [FrameType.Hidden]: { dtypes: [DType.F16, DType.F32], tokens: 'some' },
  [FrameType.Token]: { dtypes: [DType.I32], tokens: 'one' },
  [FrameType.Status]: { dtypes: [DType.Json, DType.None], width: 0, tokens: 'zero' },
  [FrameType.Error]: { dtypes: [DType.Json], width: 0, tokens: 'zero' },
  [FrameType.Logits]: { dtypes: [DType.F32], tokens: 'one' },
  [FrameType.Rewind]: { dtypes: [DType.Json], width: 0, tokens: 'zero' },
  [FrameType.Resend]: { dtypes: [DType.Json], width: 0, tokens: 'zero' },
};

export interface Frame {
  type: FrameType;
  flags: number;
  routeId: number;
  /** 32 lowercase hex digits */
  sessionId: string;
  seq: number;
  position: number;
  nTokens: number;
  dtype: DType;
  width: number;
  payload: Uint8Array;
  /** local only, never encoded: when the carrier received the frame (performance.now()) */
  receivedAt?: number;
}

export type FrameHeader = Omit<Frame, 'payload'> & { payloadLength: number };

export const NIL_SESSION = '0'.repeat(32);

function fail(code: ErrorCode, field: string, message: string): never {
  throw new MeshError(code, `frame ${field}: ${message}`, { field });
}

function checkU32(field: string, v: number): void {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) fail('FRAME_BAD_FIELD', field, `${v} is not a u32`);
}

/** Writes the session id's 16 bytes at `off`. */
function writeSessionId(view: DataView, off: number, id: string): void {
  if (!/^[0-9a-f]{32}$/.test(id)) fail('FRAME_BAD_SESSION', 'session id', `'${id}' is not 32 lowercase hex digits`);
  for (let i = 0; i < 16; i++) view.setUint8(off + i, parseInt(id.slice(2 * i, 2 * i + 2), 16));
}

function readSessionId(bytes: Uint8Array, off: number): string {
  let s = '';
  for (let i = 0; i < 16; i++) s += bytes[off + i]!.toString(16).padStart(2, '0');
  return s;
}

/**
 * Checks a header's fields against each other and against the payload length; throws a
 * MeshError naming the first field that is wrong. Shared by the encoder (so we never send
 * what a peer would refuse) and the decoders.
 */
export function validateHeader(h: FrameHeader): void {
  const rules = TYPE_RULES[h.type as FrameType];
  if (!rules) fail('FRAME_BAD_TYPE', 'type', `unknown frame type ${h.type}`);
  if ((h.flags & ~KNOWN_FLAGS) !== 0) fail('FRAME_BAD_FLAGS', 'flags', `unknown flag bits 0x${(h.flags & ~KNOWN_FLAGS).toString(16)}`);
  if (!rules.dtypes.includes(h.dtype)) {
    fail('FRAME_BAD_DTYPE', 'dtype', `dtype ${h.dtype} is not allowed for a ${FrameType[h.type]} frame (allowed: ${rules.dtypes.map((d) => DType[d]).join(', ')})`);
  }
  if (h.payloadLength > MAX_PAYLOAD_BYTES) fail('FRAME_BAD_LENGTH', 'payload length', `${h.payloadLength} bytes exceeds the limit of ${MAX_PAYLOAD_BYTES}`);
  if (rules.tokens === 'zero' && h.nTokens !== 0) fail('FRAME_BAD_DIMENSION', 'token count', `a ${FrameType[h.type]} frame carries no tokens, got ${h.nTokens}`);
  // a Verify answer is a Token frame of one token per verified position (width 1)
  const verified = h.type === FrameType.Token && (h.flags & FrameFlag.Verify) !== 0;
  if (verified && (h.nTokens < 1 || h.nTokens > MAX_TOKENS || h.width !== 1)) fail('FRAME_BAD_DIMENSION', 'token count', `a Verify Token frame carries 1..${MAX_TOKENS} tokens of width 1, got ${h.nTokens} × ${h.width}`);
  if (rules.tokens === 'one' && h.nTokens !== 1 && !verified) fail('FRAME_BAD_DIMENSION', 'token count', `a ${FrameType[h.type]} frame carries exactly 1 token, got ${h.nTokens}`);
  if (rules.tokens === 'some' && (h.nTokens < 1 || h.nTokens > MAX_TOKENS)) {
    fail('FRAME_BAD_DIMENSION', 'token count', `a ${FrameType[h.type]} frame carries 1..${MAX_TOKENS} tokens, got ${h.nTokens}`);
  }
  if (rules.width !== undefined && h.width !== rules.width) {
    fail('FRAME_BAD_DIMENSION', 'width', `a ${FrameType[h.type]} frame has width ${rules.width}, got ${h.width}`);
  }
  // a Token row is the token alone (width 1) or the token, its log-probability and k top alternatives (width 2 + 2k)
  if (h.type === FrameType.Token && h.width !== 1 && (h.width % 2 !== 0 || h.width > 2 + 2 * MAX_TOP_LOGPROBS)) {
    fail('FRAME_BAD_DIMENSION', 'width', `a Token frame has width 1 or 2 + 2k (k ≤ ${MAX_TOP_LOGPROBS} top log-probabilities), got ${h.width}`);
  }
  if (rules.width === undefined && (h.width < 1 || h.width > MAX_WIDTH)) {
    fail('FRAME_BAD_DIMENSION', 'width', `width must be 1..${MAX_WIDTH}, got ${h.width}`);
  }
  const elemBytes = DTYPE_BYTES[h.dtype];
  if (h.flags & FrameFlag.Timings) {
    if (elemBytes === undefined) fail('FRAME_BAD_FLAGS', 'flags', `a timing trailer needs a fixed-size dtype, not ${DType[h.dtype]}`);
    const trailer = h.payloadLength - h.nTokens * h.width * elemBytes - 4;
    if (trailer < 0 || trailer % TIMING_RECORD_BYTES !== 0 || trailer / TIMING_RECORD_BYTES > MAX_TIMING_RECORDS) {
      fail('FRAME_BAD_LENGTH', 'payload length', `${h.payloadLength} bytes is not ${h.nTokens} × ${h.width} × ${elemBytes} plus a timing trailer of 4 + 32·n bytes`);
    }
  } else if (elemBytes !== undefined) {
    const expected = h.nTokens * h.width * elemBytes;
    if (h.payloadLength !== expected) {
      fail('FRAME_BAD_LENGTH', 'payload length', `${h.nTokens} tokens × ${h.width} × ${elemBytes} bytes = ${expected}, got ${h.payloadLength}`);
    }
  } else if (h.dtype === DType.None && h.payloadLength !== 0) {
    fail('FRAME_BAD_LENGTH', 'payload length', `dtype None carries no payload, got ${h.payloadLength} bytes`);
  } else if (h.dtype === DType.Json && h.payloadLength > MAX_JSON_BYTES) {
    fail('FRAME_BAD_LENGTH', 'payload length', `JSON payload of ${h.payloadLength} bytes exceeds ${MAX_JSON_BYTES}`);
  }
}

/** Encodes a frame into one buffer (header + payload). */
export function encodeFrame(f: Frame): Uint8Array<ArrayBuffer> {
  for (const k of ['routeId', 'seq', 'position', 'nTokens', 'width'] as const) checkU32(k, f[k]);
  validateHeader({ ...f, payloadLength: f.payload.byteLength });
  const out = new Uint8Array(HEADER_BYTES + f.payload.byteLength);
  const v = new DataView(out.buffer);
  v.setUint32(0, FRAME_MAGIC, true);
  v.setUint8(4, FRAME_VERSION);
  v.setUint8(5, f.type);
  v.setUint16(6, f.flags, true);
  v.setUint32(8, f.routeId, true);
  writeSessionId(v, 12, f.sessionId);
  v.setUint32(28, f.seq, true);
  v.setUint32(32, f.position, true);
  v.setUint32(36, f.nTokens, true);
  v.setUint8(40, f.dtype);
  // 41..43 reserved, already zero
  v.setUint32(44, f.width, true);
  v.setUint32(48, f.payload.byteLength, true);
  out.set(f.payload, HEADER_BYTES);
  return out;
}

/** Checks the magic as soon as its bytes are there, so garbage is refused early. */
export function checkMagicPrefix(bytes: Uint8Array): void {
  const magic = [0x47, 0x4d, 0x53, 0x48];
  for (let i = 0; i < Math.min(4, bytes.byteLength); i++) {
    if (bytes[i] !== magic[i]) fail('FRAME_BAD_MAGIC', 'magic', `expected "GMSH", byte ${i} is 0x${bytes[i]!.toString(16).padStart(2, '0')}`);
  }
}

/** Decodes the 52-byte header at the start of `bytes` (which must hold at least that many). */
export function decodeHeader(bytes: Uint8Array): FrameHeader {
  checkMagicPrefix(bytes);
  if (bytes.byteLength < HEADER_BYTES) fail('FRAME_TRUNCATED', 'header', `needs ${HEADER_BYTES} bytes, got ${bytes.byteLength}`);
  const v = new DataView(bytes.buffer, bytes.byteOffset, HEADER_BYTES);
  const version = v.getUint8(4);
  if (version !== FRAME_VERSION) fail('FRAME_BAD_VERSION', 'version', `this peer speaks version ${FRAME_VERSION}, got ${version}`);
  if (v.getUint8(41) | v.getUint8(42) | v.getUint8(43)) fail('FRAME_BAD_RESERVED', 'reserved', 'bytes 41..43 must be zero');
  const h: FrameHeader = {
    type: v.getUint8(5),
    flags: v.getUint16(6, true),
    routeId: v.getUint32(8, true),
    sessionId: readSessionId(bytes, 12),
    seq: v.getUint32(28, true),
    position: v.getUint32(32, true),
    nTokens: v.getUint32(36, true),
    dtype: v.getUint8(40),
    width: v.getUint32(44, true),
    payloadLength: v.getUint32(48, true),
  };
  validateHeader(h);
  return h;
}

/** Decodes exactly one whole frame; trailing or missing bytes are errors. The payload is a view. */
export function decodeFrame(bytes: Uint8Array): Frame {
  const h = decodeHeader(bytes);
  const total = HEADER_BYTES + h.payloadLength;
  if (bytes.byteLength < total) fail('FRAME_TRUNCATED', 'payload', `needs ${h.payloadLength} bytes, got ${bytes.byteLength - HEADER_BYTES}`);
  if (bytes.byteLength > total) fail('FRAME_BAD_LENGTH', 'payload length', `${bytes.byteLength - total} bytes after the frame's end`);
  const { payloadLength: _, ...rest } = h;
  const frame = { ...rest, payload: bytes.subarray(HEADER_BYTES, total) };
  checkTrailer(frame);
  return frame;
}

/** Bytes of the frame's data, without a timing trailer. */
export function bodyBytes(f: Pick<Frame, 'nTokens' | 'width' | 'dtype' | 'flags' | 'payload'>): number {
  return f.flags & FrameFlag.Timings ? f.nTokens * f.width * DTYPE_BYTES[f.dtype]! : f.payload.byteLength;
}

/** A trailer's record count must match its length (checked once the payload is whole). */
export function checkTrailer(f: Pick<Frame, 'nTokens' | 'width' | 'dtype' | 'flags' | 'payload'>): void {
  if (!(f.flags & FrameFlag.Timings)) return;
  const p = f.payload;
  const n = new DataView(p.buffer, p.byteOffset + p.byteLength - 4, 4).getUint32(0, true);
  if (bodyBytes(f) + n * TIMING_RECORD_BYTES + 4 !== p.byteLength) {
    fail('FRAME_BAD_LENGTH', 'timings', `the trailer says ${n} records, its length holds ${(p.byteLength - bodyBytes(f) - 4) / TIMING_RECORD_BYTES}`);
  }
}

/** A frame with defaults for the fields most frames leave empty. */
export function makeFrame(f: Partial<Frame> & Pick<Frame, 'type'>): Frame {
  return {
    flags: 0,
    routeId: 0,
    sessionId: NIL_SESSION,
    seq: 0,
    position: 0,
    nTokens: 0,
    dtype: DType.None,
    width: 0,
    payload: new Uint8Array(0),
    ...f,
  };
}
