// A mixed native route: `gguf-mesh serve` with one `node --backend webgpu` (Dawn in the node's
// process; SwiftShader here) on layers [0,2) and one `node --backend cpu` on [2,5) of
// stories260K. Greedy tokens over the route must equal llama.cpp's, the room must see the
// WebGPU peer and its adapter, and a host whose Dawn finds no adapter must refuse to join.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { closeRouteTest, getJson, joinReadyRoute, spawnMesh, spawnServe } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { runCli } from './support/cli.ts';

const N = 24;
let serve: ServeInfo;
let joined: JoinedRoom;
let llamaModel: LlamaModel;

beforeAll(async () => {
  const model = await stories260K();
  serve = await spawnServe(model, ['--min-peers', '2']);
  // join one after another so the route's stage order is the join order
  const gpu = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'webgpu', '--layers', '0-2', '--name', 'gpu', '--no-cache']);
  await gpu.waitFor(/joined room/);
  const cpu = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--layers', '2-5', '--name', 'cpu', '--no-cache']);
  await cpu.waitFor(/joined room/);
  joined = await joinReadyRoute(serve);
  llamaModel = await loadModel(model);
}, 90_000);

afterAll(() => closeRouteTest(joined, llamaModel));

describe('serve + node --backend webgpu + node --backend cpu on stories260K', () => {
  it('plans the webgpu stage on layers [0,2) and the cpu stage on [2,5), and advertises the adapter', async () => {
    const route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route.stages.map((s: any) => [s.shard.start, s.shard.end, s.peer.backend])).toEqual([
      [0, 2, 'webgpu'],
      [2, 5, 'cpu'],
    ]);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    const gpuPeer = peers.find((p: any) => p.backend === 'webgpu');
    expect(gpuPeer).toBeDefined();
    expect(gpuPeer.adapter).toMatchObject({ isFallbackAdapter: expect.any(Boolean), maxBufferSize: expect.any(Number) });
    expect(gpuPeer.adapter.maxBufferSize).toBeGreaterThan(0);
    expect(peers.find((p: any) => p.backend === 'cpu')?.adapter).toBeUndefined();
  });

  it('greedy tokens over the route equal llama.cpp\'s, and each stage processed every token once', async () => {
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 3)];
    while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
    expect(tokens).toEqual(expected);
    const fed = STORIES_PROMPT_TOKENS.length + N - 1;
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(info.stages.map((st: any) => st.backend)).toEqual(['webgpu', 'cpu']);
    for (const st of info.stages) {
      expect(st.processedTokens).toEqual(new Array(st.shard.end - st.shard.start).fill(fed));
      expect(st.kvBytes).toBeGreaterThan(0);
    }
    await c.close();
    const after = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    for (const st of after.stages) expect(st.kvBytes).toBe(0);
  });

  it('`generate --join` over the mixed route prints llama.cpp\'s greedy tokens', async () => {
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const r = await runCli(['generate', '--join', serve.joinUrl, '--prompt', 'Once upon a time', '--n', String(N), '--json']);
    expect(r.code, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as { tokens: number[] }).tokens).toEqual(expected);
  });

  it('a host where Dawn finds no adapter exits non-zero with one WEBGPU_UNAVAILABLE line', async () => {
    // a Vulkan loader with no driver: Dawn enumerates no adapter
    const r = await runCli(['node', '--join', serve.joinUrl, '--backend', 'webgpu', '--no-cache'], {
      env: { VK_ICD_FILENAMES: '/nonexistent/no-driver.json' },
      timeoutMs: 30_000,
    });
    expect(r.code).toBe(1);
    const lines = r.stderr.trim().split('\n').filter((l) => l.includes('gguf-mesh node'));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^gguf-mesh node: WEBGPU_UNAVAILABLE: --backend webgpu: .*use --backend cpu/);
  });
});
