// The ring over real processes: serve and three CPU nodes on stories260K. The last node links to
// stage 0's listen address as its assignment says; a frames client's ring session gives the
// one-way session's tokens, greedy and seeded, each step after the first taken from the one sent
// ahead; the OpenAI API's completions take the ring too (their summary counts it); and after a
// stage is killed and repaired, the same completion still gives the same text.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RouteSessionClient } from '../src/route/client.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import type { SessionOpenBody } from '../src/protocol/session.ts';
import { stories260K } from './support/models.ts';
import { joinReadyRoute, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';

const STAGES = ['0-2', '2-3', '3-5'];
const PROMPT = [1, 403, 407, 263, 431, 322, 278, 35, 9, 41];
let serve: ServeInfo;
let joined: JoinedRoom;
const nodes: MeshProcess[] = [];

const open = (body: Partial<SessionOpenBody>): Promise<RouteSessionClient> => RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 256, ...body });

async function generate(c: RouteSessionClient, n: number): Promise<number[]> {
  const out = [await c.prefill(PROMPT)];
  for (let i = 0; i < n; i++) out.push(await c.decode(out[out.length - 1]!));
  return out;
}

const complete = () => streamCompletion(serve.base, serve.secret, { model: 'stories260K', prompt: 'Once upon a time, a little girl', max_tokens: 60, temperature: 0, cache_prompt: false });
const summaryOf = (events: any[]): any => events.find((e) => e.type === 'session_summary');

describe('the ring over serve and three nodes', () => {
  beforeAll(async () => {
    serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--repair-timeout', '20000']);
    for (const [i, layers] of STAGES.entries()) nodes.push(spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--layers', layers, '--name', `s${i}`, '--no-cache']));
    joined = await joinReadyRoute(serve);
  }, 90_000);
  afterAll(async () => {
    await joined?.close();
    await killAll();
  });

  it('links the last stage to stage 0 and gives the one-way tokens, greedy and seeded', async () => {
    expect(nodes[2]!.output()).not.toMatch(/no ring link/);
    for (const sampler of [undefined, { temperature: 0.8, seed: 99 }]) {
      const direct = await open({ ...(sampler ? { sampler } : {}) });
      const ring = await open({ ...(sampler ? { sampler } : {}), tokenPath: 'ring' });
      expect(await generate(ring, 50)).toEqual(await generate(direct, 50));
      expect((await ring.info()).ring).toEqual({ sentAhead: 50, taken: 49, dropped: 0 });
      await direct.close();
      await ring.close();
    }
  });

  it('takes the ring for OpenAI completions, and after a repair gives the same text', async () => {
    const before = await complete();
    expect(before.errors).toEqual([]);
    const ring = summaryOf(before.events)?.ring;
    expect(ring?.taken).toBeGreaterThan(50);
    // the middle stage dies; a fourth node takes its layers
    nodes[1]!.child.kill('SIGKILL');
    nodes.push(spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--layers', STAGES[1]!, '--name', 's1b', '--no-cache']));
    await waitForRoute(serve, 'ready', 60_000);
    let after = await complete();
    for (let i = 0; i < 20 && after.errors.length > 0; i++) {
      await new Promise((r) => setTimeout(r, 500));
      after = await complete(); // the route may still be settling on its new peer
    }
    expect(after.errors).toEqual([]);
    expect(after.text).toBe(before.text);
  }, 120_000);
});
