// The relay fallback: when two stages cannot open a data channel (or the next stage is a native
// node a browser cannot reach directly), request frames travel through the signaling server.
// The upstream peer sends {t:'relay'} on its control socket; the server hands the frame to the
// next stage over that stage's own control link and sends the reply back as {t:'relay-reply'}.
// `RelayLink` is the peer side; the server side is signaling-server/browser-peers.ts.

import { MeshError } from '../errors.ts';
import { decodeFrame, encodeFrame, FrameFlag } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import type { FrameLink } from '../transport/link.ts';
import { fromBase64, toBase64 } from '../protocol/control.ts';
import type { RelayReply, RelayRequest } from '../protocol/control.ts';

/** A FrameLink to peer `to` through the server. Replies arrive via `deliver`. */
export class RelayLink implements FrameLink {
  /** the server passes frames on in order, over the next stage's control socket */
  readonly ordered = true;
  onClose?: (reason: MeshError) => void;
  readonly counters = { frames: 0, bytes: 0 };
  private nextId = 1;
  private waiting = new Map<number, { resolve: (f: Frame) => void; reject: (e: Error) => void }>();
  private closed = false;

  constructor(
    readonly to: string,
    private readonly send: (m: RelayRequest) => void,
    /** told once when close() is called (the owner stops routing replies here) */
    private readonly onClosed: () => void = () => {},
  ) {}

  get remote(): string {
    return `relay to ${this.to}`;
  }

  request(frame: Frame): Promise<Frame> {
    if (this.closed) return Promise.reject(new MeshError('LINK_CLOSED', `${this.remote} is closed`));
    const id = this.nextId++;
    let bytes: Uint8Array;
    try {
      bytes = encodeFrame({ ...frame, flags: frame.flags & ~FrameFlag.Reply });
    } catch (e) {
      return Promise.reject(e); // a frame we would not send: the caller's promise says so
    }
    this.counters.frames++;
    this.counters.bytes += bytes.byteLength;
    return new Promise<Frame>((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.send({ t: 'relay', to: this.to, id, frame: toBase64(bytes) });
    });
  }

  /** Hands a relay-reply from the server to its request; false if it was not ours. */
  deliver(m: RelayReply): boolean {
    const w = this.waiting.get(m.id);
    if (!w) return false;
    this.waiting.delete(m.id);
    if (m.error) w.reject(MeshError.fromWire(m.error.code, m.error.message));
    else if (m.frame) {
      try {
        w.resolve(decodeFrame(fromBase64(m.frame)));
      } catch (e) {
        w.reject(e as Error);
      }
    } else w.reject(new MeshError('RELAY_FAILED', 'relay reply carried neither a frame nor an error'));
    return true;
  }

  async close(): Promise<void> {
    if (!this.closed) this.onClosed();
    this.closed = true;
    for (const w of this.waiting.values()) w.reject(new MeshError('LINK_CLOSED', `${this.remote} closed`));
    this.waiting.clear();
  }
}
