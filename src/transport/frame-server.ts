// The listening side of a native peer: one node:http server that answers the binary HTTP
// session paths, `GET /v1/status`, and WebSocket frame links at `/v1/frames`. Every request
// must carry the room secret (`Authorization: Bearer <secret>`), compared in constant time.
// A peer sending its stage's hidden states declares its id (`x-mesh-peer`) on the upgrade or
// request; the handler hears it with every frame (FrameOrigin), so the stage can refuse a peer
// that is no longer its upstream (peer/upstream-fence.ts).

import { createServer, STATUS_CODES } from 'node:http';
import type { IncomingMessage, Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { timingSafeEqual, createHash } from 'node:crypto';
import { WebSocketServer } from 'ws';
import type WebSocket from 'ws';
import { httpStatusFor, MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';
import { handleFrameHttp, sendError, sendJson } from './http.ts';
import { PEER_HEADER } from './link.ts';
import type { FrameHandler, FrameOrigin } from './link.ts';
import { serveFrames } from './ws.ts';

export const FRAMES_PATH = '/v1/frames';
const MAX_PEER_ID = 64;

/** Constant-time comparison of a presented secret with the expected one. */
export function secretMatches(presented: string | undefined, expected: string): boolean {
  if (presented === undefined) return false;
  const a = createHash('sha256').update(presented).digest();
  const b = createHash('sha256').update(expected).digest();
  return timingSafeEqual(a, b);
}

export function bearerOf(req: IncomingMessage): string | undefined {
  const h = req.headers.authorization;
  const m = h ? /^Bearer\s+(.+)$/i.exec(h) : null;
  return m ? m[1]!.trim() : undefined;
}

/** The peer a request declares itself to be; BAD_REQUEST when the header is malformed. */
export function originOf(req: IncomingMessage): FrameOrigin {
  const h = req.headers[PEER_HEADER];
  if (h === undefined) return { peer: null };
  const id = Array.isArray(h) ? null : h.trim();
  if (!id || id.length > MAX_PEER_ID) throw new MeshError('BAD_REQUEST', `${PEER_HEADER}: expected one peer id of 1 to ${MAX_PEER_ID} characters`, { field: PEER_HEADER });
  return { peer: id };
}

export interface FrameServerOptions {
  host: string;
  port: number;
  secret: string;
  /** answers every frame; `origin` names the peer the connection declared */
  handler: FrameHandler;
  /** body of GET /v1/status */
  status: () => unknown;
  messageLimit?: number;
}

export interface FrameServer {
  server: Server;
  /** http://host:port */
  url: string;
  /** ws://host:port/v1/frames */
  wsUrl: string;
  connections: Set<WebSocket>;
  close(): Promise<void>;
}

export async function startFrameServer(opts: FrameServerOptions): Promise<FrameServer> {
  const wss = new WebSocketServer({ noServer: true, maxPayload: 512 * 1024 * 1024 });
  const connections = new Set<WebSocket>();
  const server = createServer((req, res) => {
    void (async () => {
      try {
        if (!secretMatches(bearerOf(req), opts.secret)) throw new MeshError('AUTH_FAILED', 'missing or wrong room secret (Authorization: Bearer <secret>)');
        const path = new URL(req.url ?? '/', 'http://x').pathname;
        if (req.method === 'GET' && path === '/v1/status') return sendJson(res, 200, opts.status());
        const origin = originOf(req);
        if (await handleFrameHttp(req, res, (f) => opts.handler(f, origin))) return;
        throw new MeshError('NOT_FOUND', `${req.method} ${path} is not served here`);
      } catch (e) {
        if (!res.headersSent) sendError(res, e);
        else res.destroy();
      }
    })();
  });
  server.on('upgrade', (req, socket, head) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (path !== FRAMES_PATH || !secretMatches(bearerOf(req), opts.secret)) {
      refuseUpgrade(socket, path !== FRAMES_PATH ? 'NOT_FOUND' : 'AUTH_FAILED');
      return;
    }
    let origin: FrameOrigin;
    try {
      origin = originOf(req);
    } catch {
      refuseUpgrade(socket, 'BAD_REQUEST');
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      connections.add(ws);
      ws.on('close', () => connections.delete(ws));
      serveFrames(ws, (f) => opts.handler(f, origin), { ...(opts.messageLimit ? { messageLimit: opts.messageLimit } : {}) });
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const host = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  return {
    server,
    url: `http://${host}:${addr.port}`,
    wsUrl: `ws://${host}:${addr.port}${FRAMES_PATH}`,
    connections,
    close: async () => {
      for (const ws of connections) ws.terminate();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Refuses a WebSocket upgrade with the status `code` has in the registry, and no body. */
export function refuseUpgrade(socket: Duplex, code: ErrorCode): void {
  const status = httpStatusFor(code);
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
}
