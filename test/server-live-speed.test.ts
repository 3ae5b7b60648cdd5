// A speed-planned room refreshes each peer's decode figure from its live steps: a node that
// calibrates fast but then steps slowly (node --test-slow-after: its calibration's passes run at
// their own speed, the ones after 40 times as long) serves the room's first route; after a few
// decode steps the peers API shows its live figure, far above its calibration; the route does
// not change while the session is open; once it is idle, the room re-plans it onto the other
// node and leaves the slow one out. The tokens are llama.cpp's on both routes.
import { afterAll, describe, expect, it } from 'vitest';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { LlamaModelFfi, oracleGreedy } from './support/llamacpp-oracle.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import { CALIBRATION_PASSES } from '../src/peer/calibrate.ts';
import { MIN_LIVE_STEPS } from '../signaling-server/live-speed.ts';

const N = 16;

afterAll(killAll);

const peersOf = async (s: ServeInfo): Promise<any[]> => (await getJson(`${s.base}/v1/rooms/${s.roomId}/peers`, s.secret)).body.peers;
const roomRoute = async (s: ServeInfo): Promise<any> => (await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret)).body.route;

describe('live speed figures in a speed-planned room', () => {
  it('sees a peer that calibrated fast step slowly, and re-plans the idle route without it; llama.cpp tokens', async () => {
    const path = await stories260K();
    const oracle = await LlamaModelFfi.load(path);
    const expected = oracleGreedy(oracle, STORIES_PROMPT_TOKENS, N).tokens;
    oracle.dispose();
    const serve = await spawnServe(path, ['--min-peers', '1', '--plan-delay', '200', '--standby', 'off', '--planner', 'speed']);
    const node = (name: string, extra: string[] = []): Promise<unknown> => spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--no-cache', '--name', name, ...extra]).waitFor(/joined room/);
    // the slow one joins first and is the route; the other, a spare, joins once it serves
    await node('slow', ['--test-slow-factor', '40', '--test-slow-after', String(CALIBRATION_PASSES)]);
    const first = await waitForRoute(serve, 'ready');
    expect(first.stages.map((s: any) => s.peerId)).toEqual([expect.stringMatching(/^slow/)]);
    await node('plain');
    const slowOf = async (): Promise<any> => (await peersOf(serve)).find((p: any) => p.id.startsWith('slow'));
    const calibrated = (await slowOf()).speed;
    expect(calibrated.source).toBe('calibration');

    const joined = await joinRoom(serve.joinUrl, serve.secret);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 32 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS)];
    for (let i = 1; i < N / 2; i++) tokens.push(await c.decode(tokens.at(-1)!));
    // after a few steps the slow node is seen as it steps
    const live = (await slowOf()).speed;
    expect(live.source).toBe('live');
    expect(live.live.steps).toBeGreaterThanOrEqual(MIN_LIVE_STEPS);
    expect(live.calibration).toBe(calibrated.decodeMsPerLayer);
    expect(live.decodeMsPerLayer).toBeGreaterThan(5 * calibrated.decodeMsPerLayer);
    // never mid-session: the open session keeps its route past the re-planner's checks
    await new Promise((r) => setTimeout(r, 1_500));
    expect((await roomRoute(serve)).id).toBe(first.id);
    for (let i = N / 2; i < N; i++) tokens.push(await c.decode(tokens.at(-1)!));
    await c.close();
    await joined.close();
    expect(tokens).toEqual(expected);

    // idle now: re-planned onto the plain node, the slow one left out
    const deadline = Date.now() + 15_000;
    let next = await roomRoute(serve);
    while (next?.id === first.id && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
      next = await roomRoute(serve);
    }
    // a request that is not streamed, sent while the new route loads, waits for it (it was a 503)
    const during = await fetch(`${serve.base}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 4, temperature: 0 }),
    });
    expect(next.status).toBe('loading');
    expect(during.status, await during.clone().text()).toBe(200);
    expect((await during.json()).choices[0].text.length).toBeGreaterThan(0);
    const second = await waitForRoute(serve, 'ready');
    expect(second.id).not.toBe(first.id);
    expect(second.stages.map((s: any) => s.peerId)).toEqual([expect.stringMatching(/^plain/)]);
    expect(serve.proc.output()).toMatch(new RegExp(`route ${first.id}: re-planned: idle, and its predicted`));
    const again = await joinRoom(serve.joinUrl, serve.secret);
    const d = await RouteSessionClient.open(again.link, again.routeId, { contextLength: 32 });
    const replanned = [await d.prefill(STORIES_PROMPT_TOKENS)];
    for (let i = 1; i < N; i++) replanned.push(await d.decode(replanned.at(-1)!));
    await d.close();
    await again.close();
    expect(replanned).toEqual(expected);
  }, 60_000);
});
