// Tabs without WebGPU serve layers on the CPU engine: headless Chromium launched without
// WebGPU opens the room link of a real `gguf-mesh serve` on stories260K; the tabs advertise the
// CPU backend, the route forms over them (WebRTC between the tabs, a native node beside them),
// and greedy tokens through the server's binary HTTP API equal llama.cpp's. A tab with neither
// WebGPU nor WebAssembly SIMD joins as a chat client only and says why.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium } from 'playwright-core';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import type { LlamaModel } from 'node-llama-cpp';
import { chromiumArgs } from '../vite.config.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { closeBrowserTest, peerState, startPeerPage, waitForPeerState } from './support/browser-route.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';

const N = 16;
let modelPath: string;
let expected: number[];
let llamaModel: LlamaModel;
let vite: ViteDevServer;
let pageBase: string;
let noGpu: Browser;

beforeAll(async () => {
  modelPath = await stories260K();
  llamaModel = await loadModel(modelPath);
  expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
  ({ vite, pageBase } = await startPeerPage());
  // no --enable-unsafe-webgpu: this Chromium offers no WebGPU adapter
  noGpu = await chromium.launch({ executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium', args: chromiumArgs.filter((a) => a !== '--enable-unsafe-webgpu') });
});

afterAll(() => closeBrowserTest(noGpu, vite, llamaModel));

async function openTab(serve: ServeInfo, name: string, init?: () => void): Promise<{ context: BrowserContext; page: Page }> {
  const context = await noGpu.newContext();
  if (init) await context.addInitScript(init);
  const page = await context.newPage();
  page.on('console', (m) => m.type() === 'error' && console.log(`[${name}] ${m.text()}`));
  await page.goto(`${pageBase}#${new URLSearchParams({ join: serve.joinUrl, name, memory: String(1 << 30) })}`);
  return { context, page };
}

async function greedyOverHttp(serve: ServeInfo, routeId: number): Promise<number[]> {
  const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
  const c = await RouteSessionClient.open(link, routeId, { contextLength: 64 });
  const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 2)];
  while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
  await c.close();
  return tokens;
}

describe('tabs without WebGPU', () => {
  it('serve layers on the CPU engine: two tabs and a native node give llama.cpp\'s greedy tokens', async () => {
    const serve = await spawnServe(modelPath, ['--min-peers', '3']);
    const tabs = [];
    try {
      for (const name of ['c0', 'c1']) {
        const tab = await openTab(serve, name);
        const s = await waitForPeerState(tab.page, (x) => x.status === 'idle' || x.status === 'ready', `${name} joined`);
        expect(s.capabilities!.backend).toBe('cpu');
        expect(s.capabilities!.reason).toMatch(/WebGPU/);
        tabs.push(tab);
      }
      spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--threads', '1', '--memory', '1GiB', '--no-cache']);
      const route = await waitForRoute(serve, 'ready', 90_000);
      expect(route.stages).toHaveLength(3);
      const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
      expect(peers.map((p: { backend: string }) => p.backend).sort()).toEqual(['cpu', 'cpu', 'cpu']);
      expect(await greedyOverHttp(serve, route.id)).toEqual(expected);
      // the tabs passed hidden states over data channels: to each other, and to the native node
      // (which speaks WebRTC too, native-rtc.ts)
      const states = await Promise.all(tabs.map((t) => peerState(t.page)));
      expect(states.map((s) => s!.hop)).toEqual(['webrtc', 'webrtc']);
    } finally {
      for (const t of tabs) await t.context.close();
      await serve.proc.kill();
    }
  });

  it('with no WebAssembly SIMD either, a tab joins as a client only and says why', async () => {
    const serve = await spawnServe(modelPath);
    const tab = await openTab(serve, 'nothing', () => {
      WebAssembly.validate = () => false;
    });
    try {
      const s = await waitForPeerState(tab.page, (x) => x.status === 'client-only', 'client-only');
      expect(s.capabilities!.backend).toBe('none');
      expect(s.reason).toMatch(/WebGPU.*WebAssembly SIMD/);
      const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
      expect(peers).toEqual([]);
    } finally {
      await tab.context.close();
      await serve.proc.kill();
    }
  });
});
