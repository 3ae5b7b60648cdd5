// A synthetic qwen35moe (Gated DeltaNet blocks, gated attention, MoE with a sigmoid-gated
// shared expert) served split over a browser tab (WebGPU on SwiftShader in headless Chromium,
// its DeltaNet state on the GPU) and a native CPU node: the route's greedy tokens are
// llama.cpp's on the whole file, over a prompt longer than one 32-token chunk.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { PROMPT } from './support/arch-cases.ts';
import { closeBrowserTest, launchChromium, startPeerPage, waitForPeerState } from './support/browser-route.ts';
import { LlamaModelFfi, oracleGreedy } from './support/llamacpp-oracle.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import { syntheticModel } from './support/synthetic.ts';

const N = 12;
let vite: ViteDevServer;
let pageBase: string;
let browser: Browser;
let context: BrowserContext | undefined;

beforeAll(async () => {
  ({ vite, pageBase } = await startPeerPage());
  browser = await launchChromium();
});

afterAll(async () => {
  await context?.close();
  await closeBrowserTest(browser, vite, undefined);
});

describe('qwen35moe over a browser tab and a native node', () => {
  it('tab (WebGPU) + CPU node: one route, llama.cpp\'s greedy tokens', async () => {
    const model = await syntheticModel({ arch: 'qwen35moe', layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512, expertFfn: 256, sharedFfn: 256, linearKHeads: 2, linearVHeads: 4, linearHeadDim: 32 });
    const oracle = await LlamaModelFfi.load(model);
    const prompt = oracle.tokenize(`${PROMPT} ${PROMPT}`);
    const expected = oracleGreedy(oracle, prompt, N).tokens;
    oracle.dispose();
    expect(prompt.length).toBeGreaterThan(32);
    const serve = await spawnServe(model, ['--min-peers', '2']);
    try {
      context = await browser.newContext();
      const page = await context.newPage();
      page.on('console', (m) => m.type() === 'error' && console.log(`[tab] ${m.text()}`));
      await page.goto(`${pageBase}#${new URLSearchParams({ join: serve.joinUrl, name: 'tab', memory: String(1 << 30) })}`);
      await waitForPeerState(page, (s) => s.status === 'idle' || s.status === 'ready', 'tab joined');
      await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', 'cpu']).waitFor(/joined room/);
      const route = await waitForRoute(serve, 'ready', 90_000);
      expect(route.stages.map((s: any) => s.peer.backend).sort()).toEqual(['cpu', 'webgpu']);

      const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
      const c = await RouteSessionClient.open(link, route.id, { contextLength: 128 });
      const tokens = [await c.prefill(prompt)];
      while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
      const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
      console.log(`qwen35moe tab + cpu node: stages ${route.stages.map((s: any) => `${s.peer.backend} [${s.shard.start}, ${s.shard.end})`).join(' + ')}, ${tokens.length} tokens`);
      expect(info.stages.map((s: any) => s.position)).toEqual([prompt.length + N - 1, prompt.length + N - 1]);
      await c.close();
      expect(tokens).toEqual(expected);
    } finally {
      await serve.proc.kill();
    }
  });
});
