// The relay fallback: when two stages cannot open a data channel (or the next stage is a native
// node a browser cannot reach directly), request frames travel through the signaling server.
// The upstream peer sends {t:'relay'} on its control socket; the server hands the frame to the
// next stage over that stage's own control link and sends the reply back as {t:'relay-reply'}.
// `RelayLink` is the browser side, `relayThroughRoom` the server side.

import { MeshError } from '../errors.ts';
import { decodeFrame, encodeFrame, FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import type { FrameLink } from '../transport/link.ts';
import { fromBase64, toBase64 } from './messages.ts';
import type { RelayReply, RelayRequest } from './messages.ts';

/** A FrameLink to peer `to` through the server. Replies arrive via `deliver`. */
export class RelayLink implements FrameLink {
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
    if (m.error) w.reject(new MeshError(m.error.code, m.error.message));
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

/** What the server side needs from a room. */
export interface RelayRoom {
  /** the control link of peer `id` (frames to its stage), or null when it is not in the room */
  controlOf(id: string): FrameLink | null;
  /** the peer serving the stage after `id`'s in the current route */
  nextStageOf(id: string): string | null;
}

export interface RelayCounters {
  frames: number;
  bytes: number;
}

/**
 * Server side: passes one relay request to the target peer's stage and answers with its reply.
 * Counts what it relayed in `counters` (per sending peer → target).
 */
export async function relayThroughRoom(room: RelayRoom, from: string, m: RelayRequest, counters: Map<string, RelayCounters>): Promise<RelayReply> {
  try {
    const link = room.controlOf(String(m.to));
    if (!link) throw new MeshError('STAGE_UNREACHABLE', `peer ${String(m.to)} is not in this room`);
    // a stage passes hidden states to its next stage, nothing else: the relay carries no more
    if (room.nextStageOf(from) !== m.to) throw new MeshError('RELAY_REFUSED', `peer ${from} does not serve the stage before ${String(m.to)}'s`);
    const bytes = fromBase64(String(m.frame));
    const frame = decodeFrame(bytes);
    if (frame.type !== FrameType.Hidden) throw new MeshError('RELAY_REFUSED', `only Hidden frames are relayed between stages, not ${FrameType[frame.type]}`);
    const key = `${from}->${m.to}`;
    const c = counters.get(key) ?? { frames: 0, bytes: 0 };
    c.frames++;
    c.bytes += bytes.byteLength;
    counters.set(key, c);
    const reply = await link.request(frame);
    return { t: 'relay-reply', id: m.id, frame: toBase64(encodeFrame(reply)) };
  } catch (e) {
    const err = e instanceof MeshError ? e : new MeshError('RELAY_FAILED', (e as Error).message);
    return { t: 'relay-reply', id: m.id, error: { code: err.code, message: err.message } };
  }
}
