// A real HTTP file server for tests: serves files from memory with or without Range
// support and counts the requests it receives.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface RangeServer {
  /** base URL, e.g. http://127.0.0.1:PORT */
  url: string;
  /** every request seen: method, path and Range header */
  requests: { method: string; path: string; range: string | undefined }[];
  /** put (or replace) a file at a path */
  set(path: string, bytes: Uint8Array): void;
  close(): Promise<void>;
}

export interface RangeServerOptions {
  /** answer every GET with 200 and the whole file, as a server without Range support does */
  ignoreRange?: boolean;
}

export async function startRangeServer(opts: RangeServerOptions = {}): Promise<RangeServer> {
  const files = new Map<string, Uint8Array>();
  const requests: RangeServer['requests'] = [];
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]!;
    const range = req.headers.range;
    requests.push({ method: req.method ?? 'GET', path, range });
    const file = files.get(path);
    if (!file) {
      res.writeHead(404).end('not found');
      return;
    }
    const m = range?.match(/^bytes=(\d+)-(\d*)$/);
    if (opts.ignoreRange || !m) {
      res.writeHead(200, { 'content-length': file.length, 'accept-ranges': opts.ignoreRange ? 'none' : 'bytes' });
      res.end(req.method === 'HEAD' ? undefined : file);
      return;
    }
    const start = Number(m[1]);
    const end = Math.min(m[2] ? Number(m[2]) : file.length - 1, file.length - 1);
    if (start >= file.length) {
      res.writeHead(416, { 'content-range': `bytes */${file.length}` }).end();
      return;
    }
    res.writeHead(206, {
      'content-range': `bytes ${start}-${end}/${file.length}`,
      'content-length': end - start + 1,
      'accept-ranges': 'bytes',
    });
    res.end(req.method === 'HEAD' ? undefined : file.subarray(start, end + 1));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    set: (path, bytes) => void files.set(path, bytes),
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((e) => (e ? reject(e) : resolve()));
      }),
  };
}
