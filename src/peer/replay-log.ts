// What a stage keeps per session so that a stage after it can be rebuilt without recomputing
// this one: the hidden states it sent downstream, exactly as sent (f16 by default: n_embd × 2
// bytes per token), frame by frame. A repair asks for them again (a Resend frame) and they go,
// as Replay frames, to the replacement of the next stage. Besides, a 32-bit hash of every row
// this stage received, so a repair can tell the first position where a replacement's output
// differs from what the lost stage had sent.

import { DType, FrameFlag, FrameType, HEADER_BYTES, makeFrame } from '../protocol/frame.ts';
import type { Addressing } from '../protocol/payload.ts';
import type { FrameLink } from '../transport/link.ts';

export interface LoggedFrame {
  position: number;
  nTokens: number;
  dtype: DType.F16 | DType.F32;
  width: number;
  payload: Uint8Array;
}

/** FNV-1a over one row's bytes: cheap, and enough to find a row that differs. */
export function rowHash(bytes: Uint8Array, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i++) {
    h ^= bytes[i]!;
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** Hashes of each row of a payload of `nTokens` rows. */
export function rowHashes(payload: Uint8Array, nTokens: number): number[] {
  const rowBytes = payload.byteLength / nTokens;
  const out: number[] = [];
  for (let r = 0; r < nTokens; r++) out.push(rowHash(payload, r * rowBytes, (r + 1) * rowBytes));
  return out;
}

export class ReplayLog {
  private frames: LoggedFrame[] = [];
  private inHashes: number[] = [];
  bytes = 0;

  /** the frame this stage sent downstream (payload kept as it is: frames are not reused) */
  append(f: LoggedFrame): void {
    this.frames.push(f);
    this.bytes += f.payload.byteLength;
  }

  /** hashes of the rows received at positions [position, position + rows.length) */
  received(position: number, hashes: readonly number[]): void {
    this.inHashes.length = Math.min(this.inHashes.length, position);
    for (const h of hashes) this.inHashes.push(h);
  }

  /** forgets positions from `position` on (a rewind) */
  truncate(position: number): void {
    while (this.frames.length > 0) {
      const last = this.frames[this.frames.length - 1]!;
      if (last.position + last.nTokens <= position) break;
      this.frames.pop();
      this.bytes -= last.payload.byteLength;
      if (last.position < position) {
        // a frame that straddles the cut keeps its first rows
        const keep = position - last.position;
        const rowBytes = last.payload.byteLength / last.nTokens;
        this.append({ ...last, nTokens: keep, payload: last.payload.slice(0, keep * rowBytes) });
        break;
      }
    }
    this.inHashes.length = Math.min(this.inHashes.length, position);
  }

  /** positions the log covers, from 0 */
  get end(): number {
    const last = this.frames[this.frames.length - 1];
    return last ? last.position + last.nTokens : 0;
  }

  /**
   * The logged frames covering [start, end), as they were sent, or — with maxTokens > 1 —
   * neighbours merged up to maxTokens rows (for backends whose results do not depend on how
   * rows are batched).
   */
  slice(start: number, end: number, maxTokens: number): LoggedFrame[] {
    const out: LoggedFrame[] = [];
    for (const f of this.frames) {
      const a = Math.max(f.position, start);
      const b = Math.min(f.position + f.nTokens, end);
      if (a >= b) continue;
      const rowBytes = f.payload.byteLength / f.nTokens;
      const part: LoggedFrame = { ...f, position: a, nTokens: b - a, payload: f.payload.subarray((a - f.position) * rowBytes, (b - f.position) * rowBytes) };
      const prev = out[out.length - 1];
      if (prev && maxTokens > 1 && prev.dtype === part.dtype && prev.position + prev.nTokens === part.position && prev.nTokens + part.nTokens <= maxTokens) {
        const joined = new Uint8Array(prev.payload.byteLength + part.payload.byteLength);
        joined.set(prev.payload, 0);
        joined.set(part.payload, prev.payload.byteLength);
        out[out.length - 1] = { ...prev, nTokens: prev.nTokens + part.nTokens, payload: joined };
      } else out.push(part);
    }
    return out;
  }

  /** Resend: the states logged for [start, end) go to `next` again as Replay frames of up to `maxTokens` rows, in order (a failure as `failed` makes it). */
  async resend(at: Addressing, start: number, end: number, maxTokens: number, next: FrameLink, failed: (e: unknown) => Error): Promise<{ frames: number; bytes: number }> {
    let frames = 0;
    let bytes = 0;
    for (const part of this.slice(start, end, maxTokens)) {
      const out = makeFrame({ type: FrameType.Hidden, routeId: at.routeId, sessionId: at.sessionId, flags: FrameFlag.Replay, position: part.position, nTokens: part.nTokens, dtype: part.dtype, width: part.width, payload: part.payload });
      await next.request(out).catch((e: unknown) => {
        throw failed(e);
      });
      frames++;
      bytes += HEADER_BYTES + part.payload.byteLength;
    }
    return { frames, bytes };
  }

  /** hashes of the rows sent for positions [start, end) */
  sentHashes(start: number, end: number): number[] {
    return this.slice(start, end, 1).flatMap((f) => rowHashes(f.payload, f.nTokens));
  }

  /** hashes of the rows received for positions [start, end) */
  receivedHashes(start: number, end: number): number[] {
    return this.inHashes.slice(start, end);
  }
}
