// A stage's input as its backend takes it, from a frame: token ids, hidden states decoded to
// f32, or the frame's rows as they are (for backends with forwardRows) — and one chunk of it,
// for a long prefill computed in bounded pieces between other sessions' steps (and that chunk's
// frame: its payload rows, and the flags only the frame's last chunk carries).

import { MeshError } from '../errors.ts';
import type { HiddenRows, StageInput } from '../backends/types.ts';
import { DType, FrameFlag } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';

/** A Hidden frame's payload as rows for a backend's forwardRows (no decoding here). */
export function hiddenRowsOf(f: Frame): HiddenRows {
  if (f.dtype !== DType.F16 && f.dtype !== DType.F32) {
    throw new MeshError('FRAME_BAD_DTYPE', `frame dtype: hidden states must be F16 or F32, got ${DType[f.dtype] ?? f.dtype}`, { field: 'dtype' });
  }
  return { kind: 'rows', dtype: f.dtype === DType.F32 ? 'f32' : 'f16', bytes: f.payload, nTokens: f.nTokens, width: f.width };
}

/** Tokens [at, at + n) of an input of `nTokens` tokens (views, no copies). */
export function inputSlice(input: StageInput | HiddenRows, nTokens: number, at: number, n: number): StageInput | HiddenRows {
  switch (input.kind) {
    case 'tokens':
      return { kind: 'tokens', tokens: input.tokens.subarray(at, at + n) };
    case 'hidden': {
      const width = input.hidden.length / nTokens;
      return { kind: 'hidden', hidden: input.hidden.subarray(at * width, (at + n) * width), nTokens: n };
    }
    case 'rows': {
      const rowBytes = input.width * (input.dtype === 'f32' ? 4 : 2);
      return { ...input, bytes: input.bytes.subarray(at * rowBytes, (at + n) * rowBytes), nTokens: n };
    }
  }
}

/** What only a frame's last chunk carries: the sampled answer, the logits, the one-way return. */
const LAST_CHUNK_FLAGS = FrameFlag.Sample | FrameFlag.WantLogits | FrameFlag.ReturnDirect;

/** Tokens [at, at + n) of frame `f` as a frame of their own (a view of its payload rows). */
export function frameChunk(f: Frame, at: number, n: number): Frame {
  const rowBytes = f.payload.byteLength / f.nTokens;
  const last = at + n >= f.nTokens;
  return { ...f, position: f.position + at, nTokens: n, flags: last ? f.flags : f.flags & ~LAST_CHUNK_FLAGS, payload: f.payload.subarray(at * rowBytes, (at + n) * rowBytes) };
}
