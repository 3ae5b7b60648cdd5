// serve --planner speed with real node processes: each node measures itself on one layer before
// its hello, the server measures each control socket's round trip, and the route leaves out a
// peer too slow (node --test-slow-factor) or too far (node --test-link-delay-ms) to help, while
// the memory planner splits over every peer. Both give the same greedy tokens.
import { afterAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { getJson, joinReadyRoute, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import { RouteSessionClient } from '../src/route/client.ts';

/** "Once upon a time" as llama.cpp tokenises it for stories260K. */
const PROMPT = [1, 403, 407, 261, 378];

afterAll(killAll);

async function planWith(planner: 'memory' | 'speed', shaping: string[][]): Promise<{ stages: any[]; peers: any[]; tokens: number[] }> {
  const serve = await spawnServe(await stories260K(), ['--min-peers', String(shaping.length), '--plan-delay', '2000', '--standby', 'off', '--planner', planner]);
  for (const [i, extra] of shaping.entries()) {
    await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--no-cache', '--name', `s${i}`, ...extra]).waitFor(/joined room/);
  }
  const route = await waitForRoute(serve, 'ready');
  const { body } = await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret);
  const joined = await joinReadyRoute(serve);
  const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 32 });
  const tokens = [await c.prefill(PROMPT)];
  for (let i = 0; i < 5; i++) tokens.push(await c.decode(tokens.at(-1)!));
  await c.close();
  await joined.close();
  await serve.proc.kill('SIGKILL');
  return { stages: route.stages, peers: body.peers, tokens };
}

describe('the planner that knows speed and links, in a room', () => {
  it('leaves out a slow peer and a far one that the memory split uses; the same tokens', async () => {
    const memory = await planWith('memory', [[], ['--test-slow-factor', '30'], ['--test-link-delay-ms', '40']]);
    expect(memory.stages.length).toBe(3);
    expect(memory.peers.every((p: any) => p.speed === undefined)).toBe(true); // a memory room asks nobody to calibrate
    const speed = await planWith('speed', [[], ['--test-slow-factor', '30'], ['--test-link-delay-ms', '40']]);
    for (const p of speed.peers) {
      expect(p.speed.decodeMsPerLayer).toBeGreaterThan(0);
      expect(p.speed.source).toBe('calibration');
      expect(typeof p.rttMs).toBe('number');
    }
    const slow = speed.peers.find((p: any) => p.id.startsWith('s1'));
    const far = speed.peers.find((p: any) => p.id.startsWith('s2'));
    const plain = speed.peers.find((p: any) => p.id.startsWith('s0'));
    expect(slow.speed.decodeMsPerLayer).toBeGreaterThan(plain.speed.decodeMsPerLayer * 5);
    expect(far.rttMs).toBeGreaterThan(60); // 2 × 40 ms added, measured by the heartbeat
    expect(speed.stages.map((s: any) => s.peerId)).toEqual([plain.id]);
    expect(speed.tokens).toEqual(memory.tokens); // one stage and three stages: the same greedy tokens
  }, 180_000);
});
