// A browser tab (WebGPU on SwiftShader, headless Chromium) and a PyTorch peer serve one route
// of stories260K, in both orders: tab → PyTorch (the tab's hidden states reach the PyTorch
// peer over the server relay, as frames on its control socket) and PyTorch → tab (the PyTorch
// peer relays to the tab, which has no listen address). Greedy tokens equal llama.cpp's and
// every stage processes each position once.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import type { LlamaModel } from 'node-llama-cpp';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { closeBrowserTest, launchChromium, peerState, startPeerPage, waitForPeerState } from './support/browser-route.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';

const N = 16;
let modelPath: string;
let expected: number[];
let llama: LlamaModel;
let vite: ViteDevServer;
let pageBase: string;
let browser: Browser;

beforeAll(async () => {
  modelPath = await stories260K();
  llama = await loadModel(modelPath);
  expected = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, N);
  ({ vite, pageBase } = await startPeerPage());
  browser = await launchChromium();
});

afterAll(() => closeBrowserTest(browser, vite, llama));

async function openTab(serve: ServeInfo, name: string): Promise<BrowserContext> {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on('console', (m) => m.type() === 'error' && console.log(`[${name}] ${m.text()}`));
  await page.goto(`${pageBase}#${new URLSearchParams({ join: serve.joinUrl, name, memory: String(1 << 30) })}`);
  await waitForPeerState(page, (s) => s.status === 'idle' || s.status === 'ready', `${name} joined`);
  return context;
}

async function torchPeer(serve: ServeInfo, name: string): Promise<void> {
  await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'torch', '--memory', '1GiB', '--name', name, '--no-cache']).waitFor(/joined room/, 120_000);
}

/** Greedy generation through the server's binary HTTP API; checks the counters and the close. */
async function generate(serve: ServeInfo, routeId: number): Promise<number[]> {
  const c = await RouteSessionClient.open(new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` }), routeId, { contextLength: 64 });
  const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 2)];
  while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
  const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
  for (const st of info.stages) expect(st.processedTokens).toEqual(new Array(st.shard.end - st.shard.start).fill(STORIES_PROMPT_TOKENS.length + N - 1));
  await c.close();
  const closed = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
  for (const st of closed.stages) expect(st.kvBytes).toBe(0);
  return tokens;
}

describe.each([
  ['tab → PyTorch', ['tab', 'torch']],
  ['PyTorch → tab', ['torch', 'tab']],
] as const)('%s', (_label, order) => {
  let serve: ServeInfo;
  let tab: BrowserContext | undefined;

  beforeAll(async () => {
    serve = await spawnServe(modelPath, ['--min-peers', '2']);
    // stages follow the join order
    for (const who of order) {
      if (who === 'tab') tab = await openTab(serve, 'tab');
      else await torchPeer(serve, 'torch');
    }
  });
  afterAll(async () => {
    await tab?.close();
    await serve?.proc.kill();
  });

  it("serves stories260K with llama.cpp's greedy tokens", async () => {
    const route = await waitForRoute(serve, 'ready', 120_000);
    expect(route.stages.map((s: any) => s.peer.backend)).toEqual(order.map((w) => (w === 'tab' ? 'webgpu' : 'torch')));
    expect(await generate(serve, route.id)).toEqual(expected);
    const state = await peerState(tab!.pages()[0]!);
    expect(state!.hop).toBe(order[0] === 'tab' ? 'relay' : 'none');
    const relayed = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.relayed as Record<string, { frames: number }>;
    expect(Object.values(relayed).reduce((n, r) => n + r.frames, 0)).toBeGreaterThan(0);
  });
});
