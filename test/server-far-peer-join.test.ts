// A far node (a test link delay of 300 ms each way) joins a room whose planner knows speed: it
// calibrates first, loading a layer with progress reports, then opens its control socket. A
// report held back by the delay must not reach the new socket ahead of the hello — the server
// reads nothing but the hello until welcome and refuses the peer otherwise (a CI failure).
import { afterAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';

afterAll(killAll);

describe('a far node joins a speed-planned room', () => {
  it('is admitted after its calibration, with its measured speed and round trip', async () => {
    const serve = await spawnServe(await stories260K(), ['--min-peers', '2', '--standby', 'off', '--planner', 'speed']);
    const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--no-cache', '--name', 'far', '--test-link-delay-ms', '300']);
    await node.waitFor(/joined room/);
    const { body } = await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret);
    const far = body.peers.find((p: any) => p.id.startsWith('far'));
    expect(far.speed.source).toBe('calibration');
    await expect.poll(async () => (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers[0].rttMs, { timeout: 30_000 }).toBeGreaterThan(500);
  }, 90_000);
});
