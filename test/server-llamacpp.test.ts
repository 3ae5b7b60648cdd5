// A one-node route whose only stage is llama.cpp (whole model, through node-llama-cpp's
// prebuilt libraries): a native llama.cpp peer joins over WebSocket and serves the room.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { closeRouteTest, getJson, joinReadyRoute, roomEventsUntilReady, spawnMesh, spawnServe, testShardCache, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { runCli } from './support/cli.ts';
import { statSync } from 'node:fs';

const N = 24;
let serve: ServeInfo;
let joined: JoinedRoom;
let modelBytes: number;
let llamaModel: LlamaModel;

beforeAll(async () => {
  const model = await stories260K();
  modelBytes = statSync(model).size;
  serve = await spawnServe(model);
  const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp']);
  await node.waitFor(/joined room/);
  joined = await joinReadyRoute(serve);
  llamaModel = await loadModel(model);
});

afterAll(() => closeRouteTest(joined, llamaModel));

describe('one-node route on llama.cpp', () => {
  it('serves the whole model as one stage and samples on it', async () => {
    const route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route.stages).toHaveLength(1);
    expect(route.stages[0].shard).toEqual({ start: 0, end: 5 });
    expect(route.stages[0].peer.backend).toBe('llamacpp');
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS)];
    while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
    expect(tokens).toEqual(expected);
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(info.stages[0].backend ?? 'llamacpp').toBe('llamacpp');
    expect(info.position).toBe(STORIES_PROMPT_TOKENS.length + N - 1);
    await c.close();
    const after = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(after.stages[0].kvBytes).toBe(0);
  });

  it('generate --join over the llama.cpp node equals llama.cpp run directly', async () => {
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const r = await runCli(['generate', '--join', serve.joinUrl, '--prompt', 'Once upon a time', '--n', String(N), '--json']);
    expect(r.code, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as { tokens: number[] }).tokens).toEqual(expected);
  });

  it('reports loading progress like a cpu node: stage_loading from 0 up to the artifact\'s bytes, before stage_ready', async () => {
    const events = await roomEventsUntilReady(serve);
    const loading = events.filter((e) => e.type === 'stage_loading');
    expect(loading.length).toBeGreaterThanOrEqual(2);
    for (const e of loading) expect(e).toMatchObject({ stage: 0, bytesTotal: modelBytes });
    expect(loading[0].bytesDone).toBe(0);
    expect(loading.at(-1).bytesDone).toBe(modelBytes);
    for (let i = 1; i < loading.length; i++) expect(loading[i].bytesDone).toBeGreaterThanOrEqual(loading[i - 1].bytesDone);
    expect(events.findIndex((e) => e.type === 'stage_loading')).toBeLessThan(events.findIndex((e) => e.type === 'stage_ready'));
    const route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route.stages[0].loading).toEqual({ bytesDone: modelBytes, bytesTotal: modelBytes });
  });

  it('a llama.cpp node whose cache holds the artifact re-verifies it, reports that as progress, and fetches nothing', async () => {
    const again = await spawnServe(await stories260K());
    const node = spawnMesh(['node', '--join', again.joinUrl, '--backend', 'llamacpp', '--cache-dir', testShardCache()]);
    await node.waitFor(/joined room/);
    const route = await waitForRoute(again, 'ready');
    expect(route.stages[0]).toMatchObject({ bytesRead: 0, loading: { bytesDone: modelBytes, bytesTotal: modelBytes } });
    const fetches = (await getJson(`${again.base}/v1/models/stories260K/fetches`, again.secret)).body.clients;
    expect(fetches).toEqual({});
  });
});
