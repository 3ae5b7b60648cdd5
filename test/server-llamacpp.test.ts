// A one-node route whose only stage is llama.cpp (whole model, through node-llama-cpp's
// prebuilt libraries): a native llama.cpp peer joins over WebSocket and serves the room.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { runCli } from './support/cli.ts';

const N = 24;
let serve: ServeInfo;
let joined: JoinedRoom;
let llamaModel: LlamaModel;

beforeAll(async () => {
  const model = await stories260K();
  serve = await spawnServe(model);
  const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp']);
  await node.waitFor(/joined room/);
  await waitForRoute(serve, 'ready');
  joined = await joinRoom(serve.joinUrl, serve.secret);
  llamaModel = await loadModel(model);
});

afterAll(async () => {
  await joined?.close();
  await llamaModel?.dispose();
  await killAll();
});

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
});
