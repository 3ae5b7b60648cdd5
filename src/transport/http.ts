// Frames over plain HTTP: one request frame in an application/octet-stream body, one reply
// frame in the response. The paths name the session and the step so proxies and logs can
// tell them apart:
//
//   POST   /v1/sessions/{session}           SessionOpen frame
//   POST   /v1/sessions/{session}/prefill   Prefill (token ids) or Hidden frame
//   POST   /v1/sessions/{session}/decode    Decode (one token id) or one-token Hidden frame
//   DELETE /v1/sessions/{session}           → reply to a SessionClose
//   GET    /v1/sessions/{session}           → reply to a Status request, as JSON
//
// A reply that is an Error frame carries the HTTP status its code has in the registry
// (src/error-codes.ts).

import type { IncomingMessage, ServerResponse } from 'node:http';
import { codeForRefusal, httpStatusFor, MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';
import { DType, encodeFrame, FrameType, makeFrame, NIL_SESSION } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { FrameDecoder } from '../protocol/decoder.ts';
import { decodeJson } from '../protocol/payload.ts';
import { answer, errorReplyFor, unwrapReply } from './link.ts';
import type { FrameHandler, FrameLink } from './link.ts';

export const FRAME_CONTENT_TYPE = 'application/octet-stream';
const SESSION_PATH = /^\/v1\/sessions\/([0-9a-f]{32})(?:\/(prefill|decode))?$/;


export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export function sendError(res: ServerResponse, e: unknown): void {
  const err = e instanceof MeshError ? e : new MeshError('INTERNAL', String(e));
  sendJson(res, httpStatusFor(err.code), { error: { code: err.code, message: err.message, ...err.details } });
}

/**
 * A request body of at most `limitBytes`. Over the limit: `BODY_TOO_LARGE` as soon as the limit
 * is passed (the rest is read and dropped, so the error reply still reaches the client).
 */
export function readBody(req: IncomingMessage, limitBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let size = 0;
    let failed = false;
    req.on('data', (chunk: Buffer) => {
      if (failed) return;
      size += chunk.length;
      if (size > limitBytes) {
        failed = true;
        parts.length = 0;
        reject(new MeshError('BODY_TOO_LARGE', `request body: over the limit of ${limitBytes} bytes`, { limitBytes }));
        return;
      }
      parts.push(chunk);
    });
    req.on('end', () => {
      if (!failed) resolve(Buffer.concat(parts));
    });
    req.on('error', (e) => {
      if (!failed) reject(new MeshError('LINK_FAILED', `request body: ${e.message}`));
      failed = true;
    });
  });
}

/**
 * A JSON request body of at most `limitBytes` (readBody's limit); not UTF-8 JSON: `BODY_NOT_JSON`,
 * with `expected` (e.g. `{"model": "<GGUF URL>"}`) in the message.
 */
export async function readJsonBody(req: IncomingMessage, limitBytes: number, expected = 'a JSON value'): Promise<unknown> {
  const body = await readBody(req, limitBytes);
  try {
    return JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body));
  } catch {
    throw new MeshError('BODY_NOT_JSON', `request body: not JSON (expected ${expected})`);
  }
}

/** The head of a Server-Sent Events answer (the OpenAI streams, telemetry streams). */
export const SSE_HEAD = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' } as const;

function sendFrameResponse(res: ServerResponse, reply: Frame): void {
  const body = encodeFrame(reply);
  let status = 200;
  if (reply.type === FrameType.Error) status = httpStatusFor(decodeJson<{ code: string }>(reply.payload).code);
  res.writeHead(status, { 'content-type': FRAME_CONTENT_TYPE, 'content-length': body.byteLength });
  res.end(body);
}

/** Reads exactly one frame from a request body with the incremental decoder. */
export function readFrameBody(req: IncomingMessage): Promise<Frame> {
  return new Promise((resolve, reject) => {
    const decoder = new FrameDecoder();
    const frames: Frame[] = [];
    let failed = false;
    req.on('data', (chunk: Buffer) => {
      if (failed) return;
      try {
        frames.push(...decoder.push(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength)));
        if (frames.length > 1) throw new MeshError('FRAME_BAD_LENGTH', 'frame payload length: the body holds more than one frame', { field: 'payload length' });
      } catch (e) {
        failed = true;
        req.resume();
        reject(e);
      }
    });
    req.on('end', () => {
      if (failed) return;
      try {
        decoder.end();
        if (frames.length !== 1) throw new MeshError('FRAME_TRUNCATED', 'frame header: the body is empty', { field: 'header' });
        resolve(frames[0]!);
      } catch (e) {
        reject(e);
      }
    });
    req.on('error', (e) => reject(new MeshError('LINK_FAILED', e.message)));
  });
}

/** Which frame types each path accepts. */
function allowedTypes(step: string | undefined, method: string): FrameType[] | null {
  if (method === 'POST' && step === undefined) return [FrameType.SessionOpen];
  if (method === 'POST' && step === 'prefill') return [FrameType.Prefill, FrameType.Hidden];
  if (method === 'POST' && step === 'decode') return [FrameType.Decode, FrameType.Hidden];
  return null;
}

/**
 * Serves the session paths with `handler`. Returns false when the path is not one of them
 * (the caller answers it). Authentication is the caller's job, before this.
 */
export async function handleFrameHttp(req: IncomingMessage, res: ServerResponse, handler: FrameHandler, routeIdForGet = 0): Promise<boolean> {
  const url = new URL(req.url ?? '/', 'http://x');
  const m = SESSION_PATH.exec(url.pathname);
  if (!m) return false;
  const sessionId = m[1]!;
  const step = m[2];
  const method = req.method ?? 'GET';
  try {
    if (method === 'DELETE' && step === undefined) {
      sendFrameResponse(res, await answer(handler, makeFrame({ type: FrameType.SessionClose, sessionId, routeId: routeIdForGet })));
      return true;
    }
    if (method === 'GET' && step === undefined) {
      const reply = await answer(handler, makeFrame({ type: FrameType.Status, sessionId, routeId: routeIdForGet }));
      if (reply.type === FrameType.Error) {
        const body = decodeJson<{ code: string }>(reply.payload);
        sendJson(res, httpStatusFor(body.code), { error: body });
      } else sendJson(res, 200, reply.dtype === DType.Json ? decodeJson(reply.payload) : {});
      return true;
    }
    const types = allowedTypes(step, method);
    if (!types) throw new MeshError('NOT_FOUND', `${method} ${url.pathname} is not a session endpoint`);
    const frame = await readFrameBody(req);
    if (frame.sessionId !== sessionId) {
      throw new MeshError('FRAME_SESSION_MISMATCH', `frame session id: the path names ${sessionId}, the frame ${frame.sessionId}`, { field: 'session id' });
    }
    if (!types.includes(frame.type)) {
      throw new MeshError('FRAME_BAD_TYPE', `frame type: ${FrameType[frame.type]} is not accepted at ${url.pathname}`, { field: 'type' });
    }
    sendFrameResponse(res, await answer(handler, frame));
  } catch (e) {
    sendFrameResponse(res, errorReplyFor({ routeId: 0, sessionId: NIL_SESSION, seq: 0 }, e));
  }
  return true;
}

/** The requesting side over HTTP: each request frame becomes one POST/DELETE/GET. */
export class HttpLink implements FrameLink {
  onClose?: (reason: MeshError) => void;
  constructor(readonly remote: string, private readonly headers: Record<string, string> = {}) {}

  async request(frame: Frame): Promise<Frame> {
    const base = `${this.remote.replace(/\/$/, '')}/v1/sessions/${frame.sessionId}`;
    let url = base;
    let method = 'POST';
    let body: Uint8Array<ArrayBuffer> | undefined = encodeFrame(frame);
    switch (frame.type) {
      case FrameType.SessionOpen:
        break;
      case FrameType.Prefill:
        url = `${base}/prefill`;
        break;
      case FrameType.Decode:
        url = `${base}/decode`;
        break;
      case FrameType.Hidden:
        url = `${base}/${frame.nTokens === 1 ? 'decode' : 'prefill'}`;
        break;
      case FrameType.SessionClose:
        method = 'DELETE';
        body = undefined;
        break;
      default:
        throw new MeshError('FRAME_BAD_TYPE', `frame type: ${FrameType[frame.type]} has no HTTP endpoint`, { field: 'type' });
    }
    let res: Response;
    try {
      res = await fetch(url, { method, headers: { ...this.headers, ...(body ? { 'content-type': FRAME_CONTENT_TYPE } : {}) }, ...(body ? { body } : {}) });
    } catch (e) {
      throw new MeshError('LINK_FAILED', `${method} ${url} failed: ${(e as Error).message}`);
    }
    if (res.headers.get('content-type') !== FRAME_CONTENT_TYPE) {
      const text = await res.text();
      let code: unknown;
      try {
        code = (JSON.parse(text) as { error?: { code?: unknown } }).error?.code;
      } catch {
        // not JSON: the code comes from the status
      }
      throw MeshError.fromWire(code ?? codeForRefusal(res.status), `${method} ${url}: HTTP ${res.status} ${text.slice(0, 200)}`);
    }
    const decoder = new FrameDecoder();
    const frames = decoder.push(new Uint8Array(await res.arrayBuffer()));
    decoder.end();
    if (frames.length !== 1) throw new MeshError('FRAME_BAD_LENGTH', `${url} answered with ${frames.length} frames`);
    return unwrapReply(frames[0]!);
  }

  async close(): Promise<void> {}
}
