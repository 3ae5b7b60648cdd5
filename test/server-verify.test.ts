// Verified shards on native peers: a flipped byte in layer 2 (served with the original
// manifest) is refused by the peer assigned layer 2, naming the tensor, and the route never
// becomes ready; a peer restarted with a warm cache advertises its units, keeps its range and
// loads with zero bytes fetched.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { tamperedCopy } from './support/tampered.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import { joinRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';

let work: string;
let model: string;

beforeAll(async () => {
  model = await stories260K();
  work = mkdtempSync(join(tmpdir(), 'gguf-mesh-verify-'));
});

afterAll(async () => {
  await killAll();
  rmSync(work, { recursive: true, force: true });
});

async function greedy(joinUrl: string, secret: string, n: number): Promise<number[]> {
  const joined = await joinRoom(joinUrl, secret, 30_000);
  try {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS)];
    while (tokens.length < n) tokens.push(await c.decode(tokens.at(-1)!));
    await c.close();
    return tokens;
  } finally {
    await joined.close();
  }
}

describe('verified shards on native peers', () => {
  it('a flipped byte in blk.2 is refused by the peer assigned layer 2, naming the tensor; the route stays degraded', async () => {
    // the original manifest is cached beside the copy: the server serves it
    const { path: copy, victim } = await tamperedCopy(model, work, 'tampered.gguf', (name) => name.startsWith('blk.2.'));

    const serve = await spawnServe(copy, ['--min-peers', '3']);
    for (const [i, mem] of ['1GiB', '2GiB', '1GiB'].entries()) {
      const n = spawnMesh(['node', '--join', serve.joinUrl, '--memory', mem, '--name', `t${i}`, '--cache-dir', join(work, `cache-t${i}`)]);
      await n.waitFor(/joined room/);
    }
    let route = await waitForRoute(serve, 'degraded');
    // the other stages finish loading after the refusal made the route degraded
    for (let i = 0; i < 100 && route.stages.some((s: any) => s.status === 'loading'); i++) {
      await new Promise((r) => setTimeout(r, 100));
      route = (await getJson(`${serve.base}/v1/routes/${route.id}`, serve.secret)).body;
    }
    expect(route.stages.map((s: any) => s.status)).toEqual(['ready', 'failed', 'ready']);
    expect(route.status).toBe('degraded');
    const failed = route.stages[1];
    expect(failed.shard).toEqual({ start: 1, end: 4 });
    expect(failed.error.code).toBe('TENSOR_HASH_MISMATCH');
    expect(failed.error.message).toContain(victim.name);
    expect(route.reason).toContain(victim.name);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    expect(peers.find((p: any) => p.id === failed.peerId).excluded).toContain(victim.name);
    // the peer fetched the tensor twice (one re-fetch) and no tokens are produced
    const fetches = (await getJson(`${serve.base}/v1/models/tampered/fetches`, serve.secret)).body.clients[failed.peerId];
    const hits = (fetches.ranges as Array<[number, number]>).filter(([a, b]) => a <= victim.offset + 17 && b >= victim.offset + 17);
    expect(hits.length).toBe(2);
    await expect(joinRoom(serve.joinUrl, serve.secret, 500)).rejects.toMatchObject({ code: 'ROUTE_NOT_READY' });
    await serve.proc.kill();
  });

  it('a peer restarted with a warm cache advertises its units, gets the same range and fetches zero bytes', async () => {
    // the lost stage is not repaired here (no spare): its route turns degraded after 1 s, not 30
    const serve = await spawnServe(model, ['--min-peers', '2', '--repair-timeout', '1000']);
    const cacheA = join(work, 'cache-a');
    const cacheB = join(work, 'cache-b');
    const a = spawnMesh(['node', '--join', serve.joinUrl, '--name', 'a', '--cache-dir', cacheA]);
    await a.waitFor(/joined room/);
    const b = spawnMesh(['node', '--join', serve.joinUrl, '--name', 'b', '--cache-dir', cacheB]);
    await b.waitFor(/joined room/);
    const first = await waitForRoute(serve, 'ready');
    expect(first.stages.map((s: any) => [s.shard.start, s.shard.end])).toEqual([[0, 3], [3, 5]]);
    expect(first.stages.every((s: any) => s.bytesRead > 0)).toBe(true);
    const tokens = await greedy(serve.joinUrl, serve.secret, 16);

    await b.kill('SIGKILL');
    await waitForRoute(serve, 'degraded');
    const b2 = spawnMesh(['node', '--join', serve.joinUrl, '--name', 'b2', '--cache-dir', cacheB]);
    await b2.waitFor(/joined room/);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    const p2 = peers.find((p: any) => p.name === 'b2');
    expect(p2.units).toEqual(['layer.3', 'layer.4', 'head']);

    let second: any;
    for (let i = 0; i < 100; i++) {
      second = (await getJson(`${serve.base}/v1/routes`, serve.secret)).body.routes.at(-1);
      if (second.id !== first.id && second.status === 'ready') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(second.status).toBe('ready');
    expect(second.stages.map((s: any) => [s.peer.name, s.shard.start, s.shard.end])).toEqual([['a', 0, 3], ['b2', 3, 5]]);
    expect(second.stages.map((s: any) => s.bytesRead)).toEqual([0, 0]);
    const fetched = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
    expect(fetched[p2.id]).toBeUndefined();
    expect(await greedy(serve.joinUrl, serve.secret, 16)).toEqual(tokens);
  });
});
