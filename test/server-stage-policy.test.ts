// Who may be a stage (serve --stage-min-stay, --stage-min-memory), with real `gguf-mesh node`
// processes on stories260K: a newcomer is no stage before its stay is over, a peer below the
// memory floor is only ever a spare, and a peer that already holds the verified shard is a
// stage at once.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { stories260K } from './support/models.ts';

let modelPath: string;

beforeAll(async () => {
  modelPath = await stories260K();
});
afterAll(() => killAll());

describe('serve --stage-min-stay --stage-min-memory', () => {
  let serve: ServeInfo;
  const cache = mkdtempSync(join(tmpdir(), 'gguf-mesh-policy-'));
  afterAll(async () => {
    await serve?.proc.kill();
    rmSync(cache, { recursive: true, force: true });
  });

  it('plans no stage for a newcomer before its stay is over, and none ever on a peer below the memory floor', async () => {
    serve = await spawnServe(modelPath, ['--stage-min-stay', '2500', '--stage-min-memory', '512MiB', '--repair-timeout', '5000']);
    const small = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '64MiB', '--name', 'small', '--no-cache']);
    await small.waitFor(/joined room/);
    const t0 = Date.now();
    const big = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', 'big'], { env: { GGUF_MESH_CACHE: cache } });
    await big.waitFor(/joined room/);
    await new Promise((r) => setTimeout(r, 1200));
    const early = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
    expect(early.route?.status ?? 'forming').toBe('forming');
    const route = await waitForRoute(serve, 'ready', 30_000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2500);
    expect(route.stages.map((s: any) => s.peerId.split('-')[0])).toEqual(['big']);
    // the small peer is a spare: it warms up the one stage's shard
    const deadline = Date.now() + 20_000;
    let spares: any[] = [];
    while (Date.now() < deadline) {
      spares = (await getJson(`${serve.base}/v1/routes/${route.id}`, serve.secret)).body.spares;
      if (spares.some((s) => s.peerId.startsWith('small-') && s.status === 'ready')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(spares.find((s) => s.peerId.startsWith('small-'))?.status).toBe('ready');
    await big.kill();
  });

  it('makes a peer holding the verified shard a stage at once', async () => {
    // `big` cached the whole model's shard on its first run: it advertises the units and skips the stay
    const again = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', 'again'], { env: { GGUF_MESH_CACHE: cache } });
    await again.waitFor(/joined room/);
    const t0 = Date.now();
    let route: any;
    for (;;) {
      const { body } = await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret);
      if (body.route?.status === 'ready') {
        route = (await getJson(`${serve.base}/v1/routes/${body.route.id}`, serve.secret)).body;
        if (route.stages.some((s: any) => s.peerId.startsWith('again-'))) break;
      }
      if (Date.now() - t0 > 30_000) throw new Error(`no route on the returning peer: ${JSON.stringify(body)}\n${serve.proc.output()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(Date.now() - t0).toBeLessThan(2500);
    expect((await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers.find((p: any) => p.id.startsWith('again-')).units.length).toBeGreaterThan(0);
  });
});
