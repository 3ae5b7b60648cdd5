// Frames over WebSocket (the `ws` package). One binary message is one frame, or one fragment
// of a frame when the link has a message limit. Text messages are left to the caller (the
// signaling server's JSON control messages share the socket).

import WebSocket from 'ws';
import { codeForRefusal, MeshError } from '../errors.ts';
import { encodeFrame, FrameFlag, NIL_SESSION } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { Fragmenter, Reassembler } from '../protocol/fragment.ts';
import type { ReassemblyLimits } from '../protocol/fragment.ts';
import { answer, errorReplyFor, FrameLanes, PendingReplies } from './link.ts';
import { tlsOptions } from './tls-trust.ts';
import type { FrameHandler, FrameLink } from './link.ts';

export interface WsLinkOptions {
  headers?: Record<string, string>;
  /** largest message this link sends; larger frames are fragmented (default: no limit) */
  messageLimit?: number;
  /** give up connecting after this long (ms) */
  connectTimeoutMs?: number;
  /** bounds of reassembling fragmented replies (default: one largest frame's bytes, 30 s) */
  reassembly?: ReassemblyLimits;
}

function toBytes(data: WebSocket.RawData): Uint8Array {
  if (Array.isArray(data)) return new Uint8Array(Buffer.concat(data));
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/** Sends an encoded frame, fragmenting it when the link has a limit. */
function sendFrame(ws: WebSocket, frame: Frame, fragmenter: Fragmenter | null): void {
  const bytes = encodeFrame(frame);
  for (const msg of fragmenter ? fragmenter.split(bytes) : [bytes]) ws.send(msg, { binary: true });
}

/** The requesting side of a WebSocket: request() sends a frame and awaits the reply with its sequence number. */
export class WsLink implements FrameLink {
  /** one socket, one lane per session on the serving side */
  readonly ordered = true;
  onClose?: (reason: MeshError) => void;
  private pending = new PendingReplies();
  private reassembler: Reassembler;
  private fragmenter: Fragmenter | null;
  private closing = false;

  private constructor(private readonly ws: WebSocket, readonly remote: string, opts: WsLinkOptions) {
    this.fragmenter = opts.messageLimit ? new Fragmenter(opts.messageLimit) : null;
    this.reassembler = new Reassembler(opts.reassembly);
    ws.on('message', (data, isBinary) => {
      if (!isBinary) return;
      try {
        const f = this.reassembler.push(toBytes(data));
        if (f) this.pending.deliver(f);
      } catch (e) {
        this.drop(e instanceof MeshError ? e : new MeshError('FRAME_DECODE_FAILED', String(e)));
      }
    });
    ws.on('close', (code, reason) => this.drop(new MeshError('LINK_CLOSED', `connection to ${remote} closed (${code}${reason.length ? ` ${reason.toString()}` : ''})`)));
    ws.on('error', (e) => this.drop(new MeshError('LINK_FAILED', `connection to ${remote} failed: ${e.message}`)));
  }

  static connect(url: string, opts: WsLinkOptions = {}): Promise<WsLink> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { ...tlsOptions(), headers: opts.headers, handshakeTimeout: opts.connectTimeoutMs ?? 10_000, maxPayload: 512 * 1024 * 1024 });
      const onError = (e: Error): void => reject(new MeshError('LINK_FAILED', `cannot connect to ${url}: ${e.message}`));
      ws.once('error', onError);
      ws.once('unexpected-response', (_req, res) => {
        reject(new MeshError(codeForRefusal(res.statusCode ?? 0), `${url} refused the WebSocket upgrade with HTTP ${res.statusCode}`));
        ws.terminate();
      });
      ws.once('open', () => {
        ws.off('error', onError);
        resolve(new WsLink(ws, url, opts));
      });
    });
  }

  /** Wraps an already open socket (e.g. the node's control connection to the server). */
  static wrap(ws: WebSocket, remote: string, opts: WsLinkOptions = {}): WsLink {
    return new WsLink(ws, remote, opts);
  }

  /** Feeds a binary message received elsewhere (when another listener owns the socket). */
  request(frame: Frame): Promise<Frame> {
    if (this.ws.readyState !== WebSocket.OPEN) return Promise.reject(new MeshError('LINK_CLOSED', `connection to ${this.remote} is not open`));
    const { seq, reply } = this.pending.take();
    try {
      sendFrame(this.ws, { ...frame, seq, flags: frame.flags & ~FrameFlag.Reply }, this.fragmenter);
    } catch (e) {
      this.pending.fail(seq, e as Error);
    }
    return reply;
  }

  get inFlight(): number {
    return this.pending.size;
  }

  /** whether the socket still carries frames (false once it closed, failed or began closing): a rejected request on a link no longer open was lost with the carrier, not refused by the other side */
  get open(): boolean {
    return !this.closing && this.ws.readyState === WebSocket.OPEN;
  }

  async close(): Promise<void> {
    this.closing = true;
    this.pending.failAll(new MeshError('LINK_CLOSED', `link to ${this.remote} closed`));
    if (this.ws.readyState === WebSocket.CLOSED) return;
    await new Promise<void>((resolve) => {
      this.ws.once('close', () => resolve());
      this.ws.close(1000);
      setTimeout(() => {
        this.ws.terminate();
        resolve();
      }, 1000).unref();
    });
  }

  private drop(e: MeshError): void {
    this.pending.failAll(e);
    if (!this.closing) {
      this.closing = true;
      this.ws.terminate();
      this.onClose?.(e);
    }
  }
}

export interface WsServeOptions {
  messageLimit?: number;
  /** bounds of fragment reassembly (default: one largest frame's bytes, 30 s) */
  reassembly?: ReassemblyLimits;
}

/**
 * Answers request frames arriving on `ws` with `handler`: a session's frames one at a time in
 * arrival order (they never overtake each other), different sessions' side by side (FrameLanes).
 * A malformed message is answered with an Error frame naming the field; message boundaries stay
 * intact, so the socket stays usable. Fragments in reassembly are bounded in bytes and age.
 */
export function serveFrames(ws: WebSocket, handler: FrameHandler, opts: WsServeOptions = {}): void {
  const reassembler = new Reassembler(opts.reassembly);
  const fragmenter = opts.messageLimit ? new Fragmenter(opts.messageLimit) : null;
  const lanes = new FrameLanes();
  const sweep = setInterval(() => reassembler.expire(), 5000);
  sweep.unref();
  ws.on('close', () => clearInterval(sweep));
  ws.on('message', (data, isBinary) => {
    if (!isBinary) return;
    let frame: Frame | null;
    try {
      frame = reassembler.push(toBytes(data));
    } catch (e) {
      if (ws.readyState === WebSocket.OPEN) sendFrame(ws, errorReplyFor({ routeId: 0, sessionId: NIL_SESSION, seq: 0 }, e), fragmenter);
      return;
    }
    if (!frame) return;
    const req = { ...frame, receivedAt: performance.now() };
    lanes.run(req, async () => {
      const reply = await answer(handler, req);
      if (ws.readyState === WebSocket.OPEN) sendFrame(ws, reply, fragmenter);
    });
  });
}
