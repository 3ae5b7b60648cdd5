// The web app on the signaling server's own origin: the page (landing, room view, chat) and the
// web-component bundle, beside the API. The API owns /v1/** and /models/**; every other GET is
// the app's. Two ways to serve it:
//
//   dist  (what `npm start` serves) the production build, dist/app and dist/components, as
//         static files; built at install time and rebuilt on start where older than the sources
//         (app-build.ts). Nothing outside those two folders is ever served.
//   dev   vite in middleware mode, straight from the sources, for development: it serves every
//         file of the repository, so `serve` allows it on 127.0.0.1 only; its HMR WebSocket
//         listens on 127.0.0.1 at a free port.
//
// It also answers two small app endpoints the landing page needs:
//   GET  /app/rooms   the hosted models and their rooms; join URLs (with secrets) only for
//                     requests from this machine (loopback) that present the admin secret
//                     (the page URL `serve` prints carries it in its fragment) — any other
//                     process, or device, needs the link
//   POST /app/rooms   {model: url}: open a room for a pasted GGUF URL on this same server
//                     (loopback and the admin secret)
//
// The signaling server calls the app first for every request (its `app` option); the app
// answers its own paths and leaves /v1/** and /models/** to the API.

import { createReadStream, existsSync, statSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { extname, join, normalize, sep } from 'node:path';
import { MeshError } from '../src/errors.ts';
import { isUrl } from '../src/gguf/parse.ts';
import { readJsonBody, sendError, sendJson } from '../src/transport/http.ts';
import { ensureAppBuilt, REPO_ROOT } from './app-build.ts';
import { startSignalingServer } from './server.ts';
import type { SignalingServer, SignalingServerOptions } from './server.ts';

export type WebAppMode = 'dist' | 'dev';

export interface WebAppOptions {
  server: SignalingServer;
  /** default 'dist' */
  mode?: WebAppMode;
  /** where dist/ and the sources live (default: this repository) */
  root?: string;
  /** a line per model location shown on the page (e.g. "synthetic llama q8_0 … (random weights)") */
  describe?: Map<string, string>;
  /** POST /app/rooms opens rooms for pasted model URLs (default true) */
  openRooms?: boolean;
  log?: (line: string) => void;
}

/** POST /app/rooms carries one URL */
const ROOM_BODY_BYTES = 64 * 1024;

/** npm packages the browser code imports (pre-bundled by vite in dev mode). */
const DEV_DEPS = ['comlink', 'simple-peer', 'buffer', 'process', 'events', 'qrcode', 'idb-keyval', '@huggingface/gguf', '@huggingface/jinja'];

export interface WebApp {
  mode: WebAppMode;
  /** serves the request when it is the app's; false leaves it to the API */
  handle(req: IncomingMessage, res: ServerResponse): Promise<boolean>;
  close(): Promise<void>;
}

const MIME: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.wasm': 'application/wasm',
  '.map': 'application/json',
  '.wgsl': 'text/plain; charset=utf-8',
};

/** Paths the API answers; everything else belongs to the app. */
export function isApiPath(path: string): boolean {
  return path.startsWith('/v1/') || path === '/v1' || path.startsWith('/models/') || path === '/health';
}

/**
 * A request from this machine, addressed to this machine by name: the peer address is loopback
 * and so is the Host header (a page on a rebinding DNS name reaches 127.0.0.1 with its own Host).
 */
function isLoopback(req: IncomingMessage): boolean {
  const a = req.socket.remoteAddress ?? '';
  const fromHere = a === '127.0.0.1' || a === '::1' || a === '::ffff:127.0.0.1';
  const host = (req.headers.host ?? '').replace(/:\d+$/, '');
  return fromHere && (host === '127.0.0.1' || host === 'localhost' || host === '[::1]');
}

/** A free TCP port on 127.0.0.1 (for vite's HMR WebSocket, which wants a port of its own). */
function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createNetServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

export async function createWebApp(opts: WebAppOptions): Promise<WebApp> {
  const root = opts.root ?? REPO_ROOT;
  const mode = opts.mode ?? 'dist';
  const log = opts.log ?? (() => undefined);
  if (mode === 'dist') await ensureAppBuilt(root, log);
  // dev: vite starts on the first page request, so a server nobody opens in a browser pays nothing
  let vite: Promise<import('vite').ViteDevServer> | null = null;
  const startDevServer = async (): Promise<import('vite').ViteDevServer> => {
    const { createServer } = await import('vite').catch(() => {
      throw new MeshError('UI_DEV_UNAVAILABLE', '--ui dev needs vite (a dev dependency): install it, or serve the build (--ui dist)');
    });
    const hmrPort = await freeLoopbackPort();
    const dev = await createServer({
      root,
      configFile: join(root, 'vite.config.ts'),
      appType: 'spa',
      logLevel: 'warn',
      // HMR over a WebSocket of vite's own, on this machine only
      server: { middlewareMode: true, ws: { host: '127.0.0.1', port: hmrPort } },
      // pre-bundle what the page and its worker import, so no dependency is discovered late
      // (a late one makes vite re-optimise and fail the modules already loaded with 504)
      optimizeDeps: { entries: ['index.html', 'workers/*.ts', 'src/components/index.ts'], include: DEV_DEPS },
    });
    log(`web app from the sources (vite dev server, HMR on ws://127.0.0.1:${hmrPort})`);
    return dev;
  };
  const devServer = (): Promise<import('vite').ViteDevServer> =>
    (vite ??= startDevServer().catch((e: unknown) => {
      vite = null;
      throw e;
    }));

  const roomsJson = (req: IncomingMessage): unknown => {
    const local = isLoopback(req) && opts.server.access.isAdmin(req);
    const s = opts.server;
    return {
      local,
      rooms: s.rooms.map((r) => ({
        roomId: r.id,
        model: { id: r.model.id, nLayer: r.model.nLayer, fileBytes: r.model.header.fileBytes, remote: isUrl(r.model.location), description: opts.describe?.get(r.model.location) ?? null },
        peers: r.peers.size,
        route: r.route ? { id: r.route.id, status: r.route.status } : null,
        ...(local ? { joinUrl: s.joinUrl(r) } : {}),
      })),
    };
  };

  const openRoom = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (!isLoopback(req)) throw new MeshError('FORBIDDEN', 'rooms are opened from the machine that runs the server');
    if (!opts.server.access.isAdmin(req)) throw new MeshError('AUTH_FAILED', 'opening a room takes the admin secret (the page URL serve prints carries it)');
    if (opts.openRooms === false) throw new MeshError('NOT_SUPPORTED', 'this server cannot open rooms for other models');
    // JSON only: another site's page cannot send it without a CORS preflight, which this path never grants
    if (!(req.headers['content-type'] ?? '').startsWith('application/json')) throw new MeshError('BAD_REQUEST', 'POST /app/rooms takes application/json');
    const body = (await readJsonBody(req, ROOM_BODY_BYTES, '{"model": "<GGUF URL>"}')) as { model?: unknown } | null;
    const model = typeof body?.model === 'string' ? body.model.trim() : '';
    if (!isUrl(model)) throw new MeshError('BAD_REQUEST', `model must be an http(s) URL of a GGUF file, got '${model}'`);
    const room = await opts.server.addRoom(model);
    log(`room ${room.id} opened for ${model}`);
    sendJson(res, 201, { roomId: room.id, joinUrl: opts.server.joinUrl(room) });
  };

  const sendFile = (res: ServerResponse, file: string, head: boolean, immutable: boolean, cors = false): void => {
    const size = statSync(file).size;
    res.writeHead(200, {
      // the component bundle may be loaded by pages of other origins (module scripts need CORS)
      ...(cors ? { 'access-control-allow-origin': '*' } : {}),
      'content-type': MIME[extname(file)] ?? 'application/octet-stream',
      'content-length': size,
      'cache-control': immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
    });
    if (head) return void res.end();
    createReadStream(file).on('error', () => res.destroy()).pipe(res);
  };

  /** A file under dist/<dir>, refusing paths that climb out of it. */
  const distFile = (dir: string, rel: string): string | null => {
    const base = join(root, 'dist', dir);
    const file = normalize(join(base, rel));
    if (!file.startsWith(base + sep)) return null;
    return existsSync(file) && statSync(file).isFile() ? file : null;
  };

  return {
    mode,
    async handle(req, res) {
      const url = new URL(req.url ?? '/', 'http://x');
      const path = url.pathname;
      if (isApiPath(path)) return false;
      const method = req.method ?? 'GET';
      try {
        if (path === '/app/rooms') {
          if (method === 'GET') sendJson(res, 200, roomsJson(req));
          else if (method === 'POST') await openRoom(req, res);
          else throw new MeshError('NOT_FOUND', `${method} /app/rooms is not served`);
          return true;
        }
        if (method !== 'GET' && method !== 'HEAD') return false;
        if (mode === 'dev') {
          const dev = await devServer();
          // the bundle's public name maps to its source entry
          if (path === '/components/gguf-mesh.js') req.url = '/src/components/index.ts';
          if (/^\/room\/[^/]+\/?$/.test(path)) req.url = '/';
          // vite either answers (the response ends) or calls next (not a file it knows)
          const passed = await new Promise<boolean>((resolve) => {
            res.once('close', () => resolve(false));
            dev.middlewares(req, res, () => resolve(true));
          });
          if (passed && !res.headersSent) throw new MeshError('NOT_FOUND', `${path} is not part of the app`);
          return true;
        }
        const head = method === 'HEAD';
        if (path.startsWith('/components/')) {
          const f = distFile('components', path.slice('/components/'.length));
          if (!f) throw new MeshError('NOT_FOUND', `${path}: no such file in the component bundle (run npm run build)`);
          sendFile(res, f, head, false, true);
          return true;
        }
        const asset = path === '/' || /^\/room\/[^/]+\/?$/.test(path) ? 'index.html' : path.slice(1);
        const f = distFile('app', asset);
        if (!f) throw new MeshError('NOT_FOUND', `${path} is not part of the app`);
        sendFile(res, f, head, path.startsWith('/assets/'));
        return true;
      } catch (e) {
        if (!res.headersSent) sendError(res, e);
        else res.destroy();
        return true;
      }
    },
    async close() {
      if (vite) await (await vite).close();
    },
  };
}

/**
 * Starts the signaling server with the web app in front of its API: the server calls the app
 * first for every request, and rooms opened from the page are added to this same server.
 */
export async function startServerWithApp(options: SignalingServerOptions, appOptions: Omit<WebAppOptions, 'server'> = {}): Promise<{ server: SignalingServer; app: WebApp }> {
  let app: WebApp | null = null;
  // the app needs the server (its rooms, addRoom) and the server the app: requests before the
  // app exists go to the API
  const server = await startSignalingServer({ ...options, app: (req, res) => (app ? app.handle(req, res) : Promise.resolve(false)) });
  try {
    app = await createWebApp({ ...appOptions, server });
  } catch (e) {
    await server.close();
    throw e;
  }
  return { server, app };
}
