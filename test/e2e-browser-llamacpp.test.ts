// A browser tab and a native llama.cpp node share one route: the tab (WebGPU on SwiftShader
// in headless Chromium) serves the first layers, the llama.cpp node the rest from a shard GGUF
// (src/backends/llamacpp/range-stage.ts), hidden states f16 between them (relayed through the
// server: the node has no WebRTC). Greedy tokens equal whole-model llama.cpp's.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import type { LlamaModel } from 'node-llama-cpp';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { closeBrowserTest, joinTab, launchChromium, peerState, startPeerPage } from './support/browser-route.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';

const N = 16;
let llamaModel: LlamaModel;
let vite: ViteDevServer;
let pageBase: string;
let browser: Browser;
let context: BrowserContext | undefined;

beforeAll(async () => {
  llamaModel = await loadModel(await stories260K());
  ({ vite, pageBase } = await startPeerPage());
  browser = await launchChromium();
});

afterAll(async () => {
  await context?.close();
  await closeBrowserTest(browser, vite, llamaModel);
});

describe('a browser tab and a llama.cpp node', () => {
  it('tab [0, k) + llama.cpp [k, 5): one route, llama.cpp\'s greedy tokens', async () => {
    const model = await stories260K();
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const serve = await spawnServe(model, ['--min-peers', '2']);
    try {
      const tab = await joinTab(browser, pageBase, serve.joinUrl);
      context = tab.context;
      const page = tab.page;
      await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--memory', '1GiB', '--name', 'llama']).waitFor(/joined room/);
      const route = await waitForRoute(serve, 'ready', 90_000);
      expect(route.stages.map((s: any) => s.peer.backend)).toEqual(['webgpu', 'llamacpp']);
      expect(route.stages[1].shard.start).toBeGreaterThan(0);

      const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
      const c = await RouteSessionClient.open(link, route.id, { contextLength: 64 });
      const tokens = [await c.prefill(STORIES_PROMPT_TOKENS)];
      while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
      const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
      expect(info.stages[1]).toMatchObject({ backend: 'llamacpp', position: STORIES_PROMPT_TOKENS.length + N - 1 });
      await c.close();
      expect(tokens).toEqual(expected);
      // a native node speaks WebRTC too (native-rtc.ts): the tab's hop to it is a data channel
      expect((await peerState(page))!.hop).toBe('webrtc');
    } finally {
      await serve.proc.kill();
    }
  });
});
