// Frames over an ordered, reliable message carrier with a size limit — a WebRTC data channel
// (the browser-to-browser hop), and the browser's WebSocket to the signaling server. Each side
// of a hop has one job: the upstream stage sends requests and reads replies (`PipeLink`), the
// downstream stage answers requests in arrival order (`servePipe`). Frames larger than the
// message limit are fragmented with the protocol's fragment format; frames are counted per
// carrier so telemetry can show which hop carried what.

import { MeshError } from '../errors.ts';
import { encodeFrame, FrameFlag, FrameType, NIL_SESSION } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { fragment, Reassembler } from '../protocol/fragment.ts';
import type { PipeCounters } from '../protocol/control.ts';
import { newCounters } from '../protocol/control.ts';
import { answer, errorReplyFor, FrameLanes, PendingReplies } from './link.ts';
import type { FrameHandler, FrameLink } from './link.ts';

/** An ordered, reliable carrier of binary messages. */
export interface MessagePipe {
  /** e.g. "webrtc peer-2ab1" */
  readonly label: string;
  /** largest message the carrier takes (bytes) */
  readonly maxMessageSize: number;
  /** resolves once the message is handed to the carrier (after any back-pressure wait) */
  send(message: Uint8Array): Promise<void>;
  onMessage(cb: (message: Uint8Array) => void): void;
  /** called once when the carrier ends, for whatever reason */
  onClose(cb: (reason: MeshError) => void): void;
  close(): void;
}

/** Frames up to this size (encoded) travel in small messages: one send must not be held back
 *  by SCTP's burst limit (about four packets per send call), which would add a round trip. */
export const LATENCY_FRAME_BYTES = 64 * 1024;
/** Message size for latency-bound frames: four ~1.2 KB SCTP packets. */
export const SMALL_MESSAGE_BYTES = 4608;

export interface PipeFramingOptions {
  /** message size for frames up to LATENCY_FRAME_BYTES (default SMALL_MESSAGE_BYTES) */
  smallMessageBytes?: number;
}

/** Sends frames over a pipe: fragmented, serialised (one frame's messages at a time), counted. */
export class FrameSender {
  private nextId = 1;
  private queue: Promise<void> = Promise.resolve();

  constructor(
    private readonly pipe: MessagePipe,
    readonly counters: PipeCounters,
    private readonly opts: PipeFramingOptions = {},
  ) {}

  send(frame: Frame): Promise<void> {
    const bytes = encodeFrame(frame);
    const small = Math.min(this.opts.smallMessageBytes ?? SMALL_MESSAGE_BYTES, this.pipe.maxMessageSize);
    const limit = bytes.byteLength <= LATENCY_FRAME_BYTES ? small : this.pipe.maxMessageSize;
    const id = this.nextId;
    this.nextId = (this.nextId + 1) >>> 0 || 1;
    const messages = fragment(bytes, limit, id);
    const run = this.queue.then(async () => {
      for (const m of messages) {
        await this.pipe.send(m);
        this.counters.messagesSent++;
        this.counters.bytesSent += m.byteLength;
        if (m.byteLength > this.counters.largestMessage) this.counters.largestMessage = m.byteLength;
      }
      this.counters.framesSent++;
      const type = FrameType[frame.type] ?? String(frame.type);
      this.counters.sentByType[type] = (this.counters.sentByType[type] ?? 0) + 1;
    });
    this.queue = run.catch(() => undefined);
    return run;
  }
}

/** Reads messages into frames and counts them; a carrier's messages never interleave frames. */
function frameReader(pipe: MessagePipe, counters: PipeCounters, onFrame: (f: Frame) => void, onBad: (e: MeshError) => void): void {
  const reassembler = new Reassembler();
  pipe.onMessage((m) => {
    counters.messagesReceived++;
    counters.bytesReceived += m.byteLength;
    let f: Frame | null;
    try {
      f = reassembler.push(m);
    } catch (e) {
      onBad(e instanceof MeshError ? e : new MeshError('FRAME_DECODE_FAILED', String(e)));
      return;
    }
    if (!f) return;
    counters.framesReceived++;
    const type = FrameType[f.type] ?? String(f.type);
    counters.receivedByType[type] = (counters.receivedByType[type] ?? 0) + 1;
    onFrame(f);
  });
}

/** The requesting side of a pipe: request() sends a frame and awaits the reply with its sequence number. */
export class PipeLink implements FrameLink {
  /** an ordered data channel, one lane per session on the serving side */
  readonly ordered = true;
  onClose?: (reason: MeshError) => void;
  readonly counters = newCounters();
  private pending = new PendingReplies();
  private sender: FrameSender;
  private closed = false;

  constructor(
    private readonly pipe: MessagePipe,
    opts: PipeFramingOptions = {},
  ) {
    this.sender = new FrameSender(pipe, this.counters, opts);
    frameReader(pipe, this.counters, (f) => this.pending.deliver(f), (e) => this.drop(e));
    pipe.onClose((reason) => this.drop(reason));
  }

  get remote(): string {
    return this.pipe.label;
  }

  request(frame: Frame): Promise<Frame> {
    if (this.closed) return Promise.reject(new MeshError('LINK_CLOSED', `link ${this.remote} is closed`));
    const { seq, reply } = this.pending.take();
    try {
      this.sender.send({ ...frame, seq, flags: frame.flags & ~FrameFlag.Reply }).catch((e: Error) => this.pending.fail(seq, e));
    } catch (e) {
      this.pending.fail(seq, e as Error); // refused by the encoder: never sent
    }
    return reply;
  }

  get inFlight(): number {
    return this.pending.size;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.pending.failAll(new MeshError('LINK_CLOSED', `link ${this.remote} closed`));
    this.pipe.close();
  }

  private drop(e: MeshError): void {
    this.pending.failAll(e);
    if (this.closed) return;
    this.closed = true;
    this.pipe.close();
    this.onClose?.(e);
  }
}

/**
 * Answers request frames arriving on `pipe` with `handler`, one at a time in arrival order (a
 * session's frames never overtake each other). A malformed message is answered with an Error
 * frame; message boundaries stay intact, so the pipe stays usable. Returns the counters.
 */
export function servePipe(pipe: MessagePipe, handler: FrameHandler, opts: PipeFramingOptions = {}): PipeCounters {
  const counters = newCounters();
  const sender = new FrameSender(pipe, counters, opts);
  const lanes = new FrameLanes();
  const reply = (f: Frame): void => {
    sender.send(f).catch(() => undefined); // a closed pipe: the requester sees the close
  };
  frameReader(
    pipe,
    counters,
    (req) => {
      lanes.run(req, async () => reply(await answer(handler, req)));
    },
    (e) => reply(errorReplyFor({ routeId: 0, sessionId: NIL_SESSION, seq: 0 }, e)),
  );
  return counters;
}
