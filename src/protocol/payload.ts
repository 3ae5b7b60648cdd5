// Payload encodings of the frame types: token ids (i32), hidden states and logits (f16 or
// f32 rows), and JSON control documents. Builders return whole Frames so callers never set
// dtype/width/count by hand.

import { f32ToF16, F16_TABLE } from '../gguf/fp16.ts';
import { MeshError } from '../errors.ts';
import { bodyBytes, DType, FrameFlag, FrameType, makeFrame, TIMING_RECORD_BYTES } from './frame.ts';
import type { Frame } from './frame.ts';

const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder('utf-8', { fatal: true });

/** Little-endian on every host we run on; copying keeps the result aligned. */
function copyAligned(payload: Uint8Array): ArrayBuffer {
  return payload.slice().buffer;
}

export function encodeI32(values: ArrayLike<number>): Uint8Array {
  const out = new Int32Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = values[i]!;
  return new Uint8Array(out.buffer);
}

export function decodeI32(payload: Uint8Array): Int32Array {
  return new Int32Array(copyAligned(payload));
}

/** Rows of f32 → payload in `dtype` (F16 rounds to nearest even, as ggml does). */
export function encodeRows(values: Float32Array, dtype: DType.F16 | DType.F32): Uint8Array {
  if (dtype === DType.F32) return new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength));
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = f32ToF16(values[i]!);
  return new Uint8Array(out.buffer);
}

export function decodeRows(payload: Uint8Array, dtype: DType): Float32Array {
  if (dtype === DType.F32) return new Float32Array(copyAligned(payload));
  if (dtype === DType.F16) {
    const half = new Uint16Array(copyAligned(payload));
    const out = new Float32Array(half.length);
    for (let i = 0; i < half.length; i++) out[i] = F16_TABLE[half[i]!]!;
    return out;
  }
  throw new MeshError('FRAME_BAD_DTYPE', `frame dtype: ${DType[dtype] ?? dtype} is not a float row type`, { field: 'dtype' });
}

export function encodeJson(value: unknown): Uint8Array {
  return utf8.encode(JSON.stringify(value));
}

export function decodeJson<T = unknown>(payload: Uint8Array): T {
  try {
    return JSON.parse(utf8Decoder.decode(payload)) as T;
  } catch (e) {
    throw new MeshError('FRAME_BAD_PAYLOAD', `frame payload: not UTF-8 JSON (${(e as Error).message})`, { field: 'payload' });
  }
}

// ---- builders ----

export interface Addressing {
  routeId: number;
  sessionId: string;
  seq?: number;
}

export function tokensFrame(
  type: FrameType.Prefill | FrameType.Decode | FrameType.Token,
  at: Addressing,
  position: number,
  tokens: ArrayLike<number>,
  flags = 0,
): Frame {
  return makeFrame({ type, ...at, flags, position, nTokens: tokens.length, dtype: DType.I32, width: 1, payload: encodeI32(tokens) });
}

/** A sampled token with its log-probability and the top alternatives' (ids and natural-log probabilities). */
export interface SampledLogprob {
  token: number;
  logprob: number;
  top: Array<{ token: number; logprob: number }>;
}

/**
 * The last stage's answer: a Token frame holding the token, or — where the session asked for
 * log-probabilities — one I32 row [token, f32 bits of its logprob, then (id, f32 bits) per top
 * alternative] (width 2 + 2k).
 */
export function sampledFrame(at: Addressing, position: number, token: number, lp: SampledLogprob | null, flags = 0): Frame {
  if (!lp) return tokensFrame(FrameType.Token, at, position, [token], flags);
  const row = new Int32Array(2 + 2 * lp.top.length);
  const bits = new Float32Array(row.buffer);
  row[0] = token;
  bits[1] = lp.logprob;
  lp.top.forEach((t, i) => {
    row[2 + 2 * i] = t.token;
    bits[3 + 2 * i] = t.logprob;
  });
  return makeFrame({ type: FrameType.Token, ...at, flags, position, nTokens: 1, dtype: DType.I32, width: row.length, payload: new Uint8Array(row.buffer) });
}

/** A Token frame's token, and its log-probabilities where the frame carries them. */
export function decodeSampled(f: Frame): { token: number; logprob: SampledLogprob | null } {
  const row = decodeI32(payloadBody(f));
  const token = row[0]!;
  if (f.width < 2) return { token, logprob: null };
  const bits = new Float32Array(row.buffer, row.byteOffset, row.length);
  const top: SampledLogprob['top'] = [];
  for (let i = 2; i + 1 < f.width; i += 2) top.push({ token: row[i]!, logprob: bits[i + 1]! });
  return { token, logprob: { token, logprob: bits[1]!, top } };
}

/** Hidden states `[nTokens × width]` f32 sent as `dtype`. */
export function hiddenFrame(at: Addressing, position: number, hidden: Float32Array, nTokens: number, dtype: DType.F16 | DType.F32, flags = 0): Frame {
  const width = hidden.length / nTokens;
  return makeFrame({ type: FrameType.Hidden, ...at, flags, position, nTokens, dtype, width, payload: encodeRows(hidden, dtype) });
}

/** Hidden states already encoded as the frame carries them: `payload` is [nTokens × width] of `dtype`. */
export function hiddenRowsFrame(at: Addressing, position: number, payload: Uint8Array, nTokens: number, width: number, dtype: DType.F16 | DType.F32, flags = 0): Frame {
  return makeFrame({ type: FrameType.Hidden, ...at, flags, position, nTokens, dtype, width, payload });
}

/** Logits of the last position, `[n_vocab]` f32. */
export function logitsFrame(at: Addressing, position: number, logits: Float32Array, flags = 0): Frame {
  return makeFrame({ type: FrameType.Logits, ...at, flags, position, nTokens: 1, dtype: DType.F32, width: logits.length, payload: encodeRows(logits, DType.F32) });
}

export function jsonFrame(type: FrameType.SessionOpen | FrameType.Status | FrameType.Error, at: Addressing, value: unknown, flags = 0): Frame {
  return makeFrame({ type, ...at, flags, dtype: DType.Json, payload: encodeJson(value) });
}

/** A repair request to one stage: Rewind to `position`, or Resend from `position` (see frame.ts). */
export function repairFrame(type: FrameType.Rewind | FrameType.Resend, at: Addressing, position: number, value: unknown): Frame {
  return makeFrame({ type, ...at, position, dtype: DType.Json, payload: encodeJson(value) });
}

export interface ErrorBody {
  code: string;
  message: string;
  /** the stage index where it happened, when a stage reports it */
  stage?: number;
  /** further machine-readable facts (e.g. expected and received positions) */
  details?: Record<string, unknown>;
}

export function errorFrame(at: Addressing, body: ErrorBody): Frame {
  return jsonFrame(FrameType.Error, at, body, FrameFlag.Reply);
}

/** Turns an Error frame back into the MeshError it describes. */
export function errorFromFrame(f: Frame): MeshError {
  const body = decodeJson<Partial<ErrorBody>>(f.payload);
  const details: Record<string, unknown> = { ...(body.details ?? {}) };
  if (body.stage !== undefined) details.stage = body.stage;
  return MeshError.fromWire(body.code, String(body.message ?? 'remote error'), details);
}

/** The answer to `req`: same route, session and sequence, Reply flag set. */
export function replyAddress(req: Frame): Addressing {
  return { routeId: req.routeId, sessionId: req.sessionId, seq: req.seq };
}

// ---- step timings (trailer) ----

/** One stage's part of a step, in microseconds and bytes (8 × u32 on the wire). */
export interface StepTiming {
  stage: number;
  /** first position of the step */
  position: number;
  /** backend forward pass */
  computeUs: number;
  /** waiting for the next stage's reply (transfer + everything downstream) */
  downstreamUs: number;
  /** from the frame's arrival to this stage's reply */
  handleUs: number;
  /** of handleUs, time the frame waited behind others on its connection */
  queueUs: number;
  /** whole frames received from the previous stage / sent to the next */
  bytesIn: number;
  bytesOut: number;
}

const u32 = (x: number): number => Math.max(0, Math.min(0xffffffff, Math.round(x)));

/** The frame's data payload, without a timing trailer. */
export function payloadBody(f: Frame): Uint8Array {
  return f.payload.subarray(0, bodyBytes(f));
}

/** Timing records a frame carries (none without the Timings flag). */
export function timingsOf(f: Frame): StepTiming[] {
  if (!(f.flags & FrameFlag.Timings)) return [];
  const body = bodyBytes(f);
  const v = new DataView(f.payload.buffer, f.payload.byteOffset, f.payload.byteLength);
  const n = v.getUint32(f.payload.byteLength - 4, true);
  const out: StepTiming[] = [];
  for (let i = 0; i < n; i++) {
    const o = body + i * TIMING_RECORD_BYTES;
    const r = (k: number): number => v.getUint32(o + 4 * k, true);
    out.push({ stage: r(0), position: r(1), computeUs: r(2), downstreamUs: r(3), handleUs: r(4), queueUs: r(5), bytesIn: r(6), bytesOut: r(7) });
  }
  return out;
}

/** The same frame with `records` appended to its trailer (the reply passing up the chain). */
export function withTimings(f: Frame, records: StepTiming[]): Frame {
  if (DTYPE_FIXED[f.dtype] === undefined) return f; // JSON/None replies carry no trailer
  const all = [...timingsOf(f), ...records];
  const body = payloadBody(f);
  const payload = new Uint8Array(body.byteLength + all.length * TIMING_RECORD_BYTES + 4);
  payload.set(body, 0);
  const v = new DataView(payload.buffer);
  all.forEach((t, i) => {
    const o = body.byteLength + i * TIMING_RECORD_BYTES;
    [t.stage, t.position, t.computeUs, t.downstreamUs, t.handleUs, t.queueUs, t.bytesIn, t.bytesOut].forEach((x, k) => v.setUint32(o + 4 * k, u32(x), true));
  });
  v.setUint32(payload.byteLength - 4, all.length, true);
  return { ...f, flags: f.flags | FrameFlag.Timings, payload };
}

const DTYPE_FIXED: Partial<Record<DType, true>> = { [DType.F32]: true, [DType.F16]: true, [DType.I32]: true };
