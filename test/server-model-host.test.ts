// Model hosting with Range: 206 with Content-Range, suffix and open ranges, HEAD, 416, and
// the secret required — against the real `serve` process.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { stories260K } from './support/models.ts';
import { killAll, spawnMesh, spawnServe, waitForRoute, getJson } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { parseRange } from '../signaling-server/model-host.ts';
import { runCli } from './support/cli.ts';

let serve: ServeInfo;
let bytes: Buffer;

beforeAll(async () => {
  const model = await stories260K();
  bytes = readFileSync(model);
  serve = await spawnServe(model);
});

afterAll(killAll);

const get = (range?: string, method = 'GET') =>
  fetch(`${serve.base}/models/stories260K.gguf`, { method, headers: { authorization: `Bearer ${serve.secret}`, ...(range ? { range } : {}) } });

describe('model hosting', () => {
  it('parses single ranges as RFC 9110 says', () => {
    expect(parseRange('bytes=0-9', 100)).toEqual({ start: 0, end: 9 });
    expect(parseRange('bytes=90-', 100)).toEqual({ start: 90, end: 99 });
    expect(parseRange('bytes=-10', 100)).toEqual({ start: 90, end: 99 });
    expect(parseRange('bytes=95-200', 100)).toEqual({ start: 95, end: 99 });
    expect(parseRange('bytes=100-', 100)).toBeNull();
    expect(parseRange('bytes=5-2', 100)).toBeNull();
    expect(parseRange('items=0-1', 100)).toBeNull();
    expect(parseRange(undefined, 100)).toBeUndefined();
  });

  it('answers ranges with 206 and the exact bytes, HEAD with the size, and 416 past the end', async () => {
    const r = await get('bytes=100-199');
    expect(r.status).toBe(206);
    expect(r.headers.get('content-range')).toBe(`bytes 100-199/${bytes.length}`);
    expect(Buffer.from(await r.arrayBuffer()).equals(bytes.subarray(100, 200))).toBe(true);
    const tail = await get('bytes=-16');
    expect(Buffer.from(await tail.arrayBuffer()).equals(bytes.subarray(bytes.length - 16))).toBe(true);
    const head = await get(undefined, 'HEAD');
    expect(head.status).toBe(200);
    expect(Number(head.headers.get('content-length'))).toBe(bytes.length);
    expect(head.headers.get('accept-ranges')).toBe('bytes');
    const past = await get(`bytes=${bytes.length}-`);
    expect(past.status).toBe(416);
    expect(past.headers.get('content-range')).toBe(`bytes */${bytes.length}`);
    const whole = await get();
    expect(whole.status).toBe(200);
    expect((await whole.arrayBuffer()).byteLength).toBe(bytes.length);
    expect((await fetch(`${serve.base}/models/stories260K.gguf`)).status).toBe(401);
  });

  it('explicit --layers win over the memory split; stages linked over binary HTTP generate llama.cpp\'s text', async () => {
    const procs: Record<string, ReturnType<typeof spawnMesh>> = {};
    for (const [name, layers] of [['hi', '2-5'], ['lo', '0-2']]) {
      // hidden states between these two go over binary HTTP requests
      const n = spawnMesh(['node', '--join', serve.joinUrl, '--name', name!, '--layers', layers!, '--memory', name === 'hi' ? '8GiB' : '1GiB', '--no-cache', '--carrier', 'http']);
      await n.waitFor(/joined room/);
      procs[name!] = n;
    }
    // a route may already have formed from the first peer alone; wait for one with both
    let route: any;
    for (let i = 0; i < 100; i++) {
      route = (await getJson(`${serve.base}/v1/routes`, serve.secret)).body.routes.at(-1);
      if (route?.status === 'ready' && route.stages.length === 2) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(route.stages.map((s: any) => [s.peer.name, s.shard.start, s.shard.end])).toEqual([['lo', 0, 2], ['hi', 2, 5]]);
    await waitForRoute(serve, 'ready');
    await procs.lo!.waitFor(/layers 0-2 ready \(.*next stage over http\)/);
    const r = await runCli(['generate', '--join', serve.joinUrl, '--prompt', 'Once upon a time', '--n', '16', '--json']);
    expect(r.code, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as { text: string }).text.startsWith(', there was a little girl named Lily.')).toBe(true);
  });
});
