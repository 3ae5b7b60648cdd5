// An incremental frame decoder for byte streams (an HTTP body, a TCP-like carrier): a state
// machine that waits for the 52-byte header, validates it before the payload arrives (so a
// corrupt length never allocates), then waits for the payload. Bytes split at any boundary
// decode to the same frames. After an error the decoder refuses further input: the stream is
// out of sync and the carrier must close.

import { MeshError } from '../errors.ts';
import { checkMagicPrefix, checkTrailer, decodeHeader, HEADER_BYTES } from './frame.ts';
import type { Frame, FrameHeader } from './frame.ts';

type State = { kind: 'header' } | { kind: 'payload'; header: FrameHeader } | { kind: 'failed'; error: MeshError };

export class FrameDecoder {
  private state: State = { kind: 'header' };
  /** received bytes not yet consumed, in arrival order */
  private chunks: Uint8Array[] = [];
  private buffered = 0;

  /** Adds bytes and returns every frame they complete. Throws a MeshError on invalid input. */
  push(bytes: Uint8Array): Frame[] {
    if (this.state.kind === 'failed') throw this.state.error;
    if (bytes.byteLength > 0) {
      this.chunks.push(bytes);
      this.buffered += bytes.byteLength;
    }
    const frames: Frame[] = [];
    try {
      for (;;) {
        if (this.state.kind === 'header') {
          if (this.buffered < HEADER_BYTES) {
            if (this.buffered > 0) checkMagicPrefix(this.peek(Math.min(4, this.buffered)));
            break;
          }
          this.state = { kind: 'payload', header: decodeHeader(this.take(HEADER_BYTES)) };
        } else if (this.state.kind === 'payload') {
          const h = this.state.header;
          if (this.buffered < h.payloadLength) break;
          const { payloadLength, ...rest } = h;
          const frame = { ...rest, payload: this.take(payloadLength) };
          checkTrailer(frame);
          frames.push(frame);
          this.state = { kind: 'header' };
        } else {
          break;
        }
      }
    } catch (e) {
      const error = e instanceof MeshError ? e : new MeshError('FRAME_DECODE_FAILED', String(e));
      this.state = { kind: 'failed', error };
      throw error;
    }
    return frames;
  }

  /** True when no partial frame is pending: a stream may end here. */
  get idle(): boolean {
    return this.state.kind === 'header' && this.buffered === 0;
  }

  /** Call at end of stream: a partial frame is an error naming what was missing. */
  end(): void {
    if (this.state.kind === 'failed') throw this.state.error;
    if (this.state.kind === 'payload') {
      throw new MeshError('FRAME_TRUNCATED', `frame payload: stream ended ${this.state.header.payloadLength - this.buffered} bytes short`, { field: 'payload' });
    }
    if (this.buffered > 0) throw new MeshError('FRAME_TRUNCATED', `frame header: stream ended after ${this.buffered} of ${HEADER_BYTES} bytes`, { field: 'header' });
  }

  private peek(n: number): Uint8Array {
    const first = this.chunks[0]!;
    if (first.byteLength >= n) return first.subarray(0, n);
    const out = new Uint8Array(n);
    let off = 0;
    for (const c of this.chunks) {
      const k = Math.min(c.byteLength, n - off);
      out.set(c.subarray(0, k), off);
      off += k;
      if (off === n) break;
    }
    return out;
  }

  /** Removes and returns the next `n` bytes (a view when they lie in one chunk). */
  private take(n: number): Uint8Array {
    let out: Uint8Array;
    const first = this.chunks[0];
    if (n === 0) return new Uint8Array(0);
    if (first && first.byteLength >= n) {
      out = first.subarray(0, n);
      if (first.byteLength === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
    } else {
      out = new Uint8Array(n);
      let off = 0;
      while (off < n) {
        const c = this.chunks[0]!;
        const k = Math.min(c.byteLength, n - off);
        out.set(c.subarray(0, k), off);
        off += k;
        if (k === c.byteLength) this.chunks.shift();
        else this.chunks[0] = c.subarray(k);
      }
    }
    this.buffered -= n;
    return out;
  }
}
