// Peers that cannot be reached at their advertised address still form a working route: the
// server drives stage 0 over its control socket, and a stage that cannot connect to the next
// one relays its hidden states through the server. Tokens stay llama.cpp's.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { joinRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';

// nothing listens on port 9 of loopback (discard): connecting is refused at once
const UNREACHABLE = 'ws://127.0.0.1:9/v1/frames';
let serve: ServeInfo;
let llamaModel: LlamaModel;

beforeAll(async () => {
  const model = await stories260K();
  serve = await spawnServe(model, ['--min-peers', '3']);
  for (const [name, extra] of [['b', ['--advertise', UNREACHABLE]], ['a', []], ['c', ['--advertise', UNREACHABLE]]] as const) {
    const n = spawnMesh(['node', '--join', serve.joinUrl, '--name', name, '--no-cache', ...extra]);
    await n.waitFor(/joined room/);
  }
  await waitForRoute(serve, 'ready');
  llamaModel = await loadModel(model);
});

afterAll(async () => {
  await llamaModel?.dispose();
  await killAll();
});

describe('unreachable peers', () => {
  it('serve greedy tokens through control-socket entry and server relay', async () => {
    const route = (await getJson(`${serve.base}/v1/routes`, serve.secret)).body.routes.at(-1);
    expect(route.stages.map((s: any) => s.peer.name)).toEqual(['b', 'a', 'c']);
    const joined = await joinRoom(serve.joinUrl, serve.secret);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS)];
    while (tokens.length < 16) tokens.push(await c.decode(tokens.at(-1)!));
    await c.close();
    await joined.close();
    expect(tokens).toEqual(await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, 16));
    // a → c went through the server; b → a was direct
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body;
    const id = (name: string) => peers.peers.find((p: any) => p.name === name).id;
    expect(peers.relayed[`${id('a')}->${id('c')}`].frames).toBeGreaterThanOrEqual(16);
    expect(peers.relayed[`${id('b')}->${id('a')}`]).toBeUndefined();
  });
});
