// The pieces behind `npm start` without a browser: the default model (made once, cached, a real
// GGUF llama.cpp-shaped with a chat template) and the web app in front of a real signaling
// server — which paths it answers, which it leaves to the API, and what it refuses.
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readHeader } from '../src/gguf/parse.ts';
import { defaultCacheDir, ensureDefaultModel, modelsToServe } from '../src/model/default-model.ts';
import { startSignalingServer } from '../signaling-server/server.ts';
import type { SignalingServer, SignalingServerOptions } from '../signaling-server/server.ts';
import { isApiPath, startServerWithApp } from '../signaling-server/static.ts';
import type { WebApp } from '../signaling-server/static.ts';
import { ensureBuilt } from './fixtures/ui/harness.ts';

const cache = mkdtempSync(join(tmpdir(), 'gguf-mesh-default-'));
let server: SignalingServer;
let app: WebApp;

beforeAll(async () => {
  await ensureBuilt();
  const { models, describe: describeModels } = await modelsToServe([], { GGUF_MESH_CACHE: cache });
  const opts: SignalingServerOptions = { port: 0, models };
  ({ server, app } = await startServerWithApp(opts, { mode: 'dist', describe: describeModels }));
}, 180_000);

afterAll(async () => {
  await app?.close();
  await server?.close();
  rmSync(cache, { recursive: true, force: true });
});

describe('default model', () => {
  it('is made once under the cache dir and reused', async () => {
    const again = await ensureDefaultModel(cache);
    expect(again.made).toBe(false);
    expect(again.path.startsWith(join(cache, 'models'))).toBe(true);
    const mtime = statSync(again.path).mtimeMs;
    expect((await ensureDefaultModel(cache)).path).toBe(again.path);
    expect(statSync(again.path).mtimeMs).toBe(mtime);
    const h = await readHeader(again.path);
    expect(h.metadata['general.architecture']).toBe('llama');
    expect(h.metadata['llama.block_count']).toBe(6);
    expect(String(h.metadata['tokenizer.chat_template'])).toContain('<|im_start|>');
  });

  it('a named model or $GGUF_MESH_MODEL wins; the cache dir follows $GGUF_MESH_CACHE, then $XDG_CACHE_HOME', async () => {
    expect((await modelsToServe(['/m.gguf'], {})).models).toEqual(['/m.gguf']);
    expect((await modelsToServe([], { GGUF_MESH_MODEL: 'http://h/x.gguf' })).models).toEqual(['http://h/x.gguf']);
    expect(defaultCacheDir({ GGUF_MESH_CACHE: '/c' })).toBe('/c');
    expect(defaultCacheDir({ XDG_CACHE_HOME: '/x' })).toBe(join('/x', 'gguf-mesh'));
  });
});

describe('web app on the signaling server', () => {
  const get = (path: string, init?: RequestInit): Promise<Response> => fetch(`${server.url}${path}`, init);

  it('serves the page at / and at every room link, its assets, and the component bundle with CORS', async () => {
    for (const path of ['/', `/room/${server.rooms[0]!.id}`]) {
      const res = await get(path);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toContain('text/html');
      expect(await res.text()).toContain('<div id="app">');
    }
    const html = await (await get('/')).text();
    const script = /src="(\/assets\/[^"]+\.js)"/.exec(html)![1]!;
    const js = await get(script);
    expect(js.status).toBe(200);
    expect(js.headers.get('content-type')).toContain('text/javascript');
    expect(js.headers.get('cache-control')).toContain('immutable');
    const bundle = await get('/components/gguf-mesh.js', { method: 'HEAD' });
    expect(bundle.status).toBe(200);
    expect(bundle.headers.get('access-control-allow-origin')).toBe('*');
    expect(Number(bundle.headers.get('content-length'))).toBeGreaterThan(10_000);
  });

  it('leaves the API its paths and refuses what is not the app', async () => {
    expect(isApiPath('/v1/rooms')).toBe(true);
    expect(isApiPath('/models/x.gguf')).toBe(true);
    expect(isApiPath('/room/abc')).toBe(false);
    expect((await get('/v1/rooms')).status).toBe(401); // still the API's answer
    const missing = await get('/assets/nothing-here.js');
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { error: { code: string } }).error.code).toBe('NOT_FOUND');
    for (const sneaky of ['/assets/%2e%2e/%2e%2e/package.json', '/components/..%2f..%2fpackage.json']) expect((await get(sneaky)).status).toBe(404);
  });

  it('POST /app/rooms: a body over 64 KiB is BODY_TOO_LARGE (413), a malformed one BODY_NOT_JSON (400); no room opens', async () => {
    const post = (body: string): Promise<Response> => get('/app/rooms', { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${server.access.adminSecret}` }, body });
    const huge = await post(JSON.stringify({ model: `https://example.org/${'m'.repeat(100_000)}.gguf` }));
    expect(huge.status).toBe(413);
    expect(((await huge.json()) as { error: { code: string; limitBytes: number } }).error).toMatchObject({ code: 'BODY_TOO_LARGE', limitBytes: 64 * 1024 });
    const broken = await post('{"model": ');
    expect(broken.status).toBe(400);
    const error = ((await broken.json()) as { error: { code: string; message: string } }).error;
    expect(error.code).toBe('BODY_NOT_JSON');
    expect(error.message).toContain('{"model": "<GGUF URL>"}');
    expect((await post('null')).status).toBe(400);
    expect(((await (await get('/app/rooms')).json()) as { rooms: unknown[] }).rooms).toHaveLength(1);
  });

  it('describes the default model in /app/rooms', async () => {
    const body = (await (await get('/app/rooms')).json()) as { rooms: Array<{ model: { id: string; description: string } }> };
    expect(body.rooms[0]!.model.id).toBe('gguf-mesh-default');
    expect(body.rooms[0]!.model.description).toMatch(/random weights/);
  });
});
