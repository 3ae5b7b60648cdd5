// Browser peers on a split GGUF: `gguf-mesh serve` hosts a stories-sized synthetic llama cut
// into 3 parts the way gguf-split does (blocks straddle parts), two headless-Chromium tabs
// (WebGPU on SwiftShader) load their slices by Range from the parts, and the route's greedy
// tokens equal the same two-tab route's over the unsplit file (and llama.cpp's on it). Each tab
// fetched only its shard's tensors, from exactly the parts that hold them.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import type { LlamaModel } from 'node-llama-cpp';
import { buildManifest } from '../src/gguf/manifest.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import { shardTensors } from '../src/gguf/verify.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { REPO_ROOT } from './support/cli.ts';
import { closeBrowserTest, launchChromium, peerState, startPeerPage, waitForPeerState } from './support/browser-route.ts';
import { greedyGenerate, loadModel, tokenize } from './support/llama.ts';
import { getJson, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { splitSyntheticModel } from './support/split-model.ts';
import type { SplitModel } from './support/split-model.ts';

// stories260K's shape (64 wide, 8 heads, 4 KV heads, 172 ffn), 4 blocks: 39 tensors, 13 a part
const OPTIONS = { arch: 'llama', type: 'f32', layers: 4, embd: 64, heads: 8, kvHeads: 4, ffn: 172, vocab: 512, ctx: 256 } as const;
const N = 12;

let model: SplitModel;
let manifest: Manifest;
let promptTokens: number[];
let llamaTokens: number[];
let llamaModel: LlamaModel;
let vite: ViteDevServer;
let pageBase: string;
let browser: Browser;

beforeAll(async () => {
  model = await splitSyntheticModel(OPTIONS, join(REPO_ROOT, '.cache', 'split-browser-test'), 'stories-split', 13);
  expect(model.parts).toHaveLength(3);
  manifest = await buildManifest(model.parts[0]!);
  expect(manifest.artifact.files).toHaveLength(3);
  llamaModel = await loadModel(model.whole);
  promptTokens = tokenize(llamaModel, 'Once upon a time');
  llamaTokens = await greedyGenerate(llamaModel, promptTokens, N);
  ({ vite, pageBase } = await startPeerPage());
  browser = await launchChromium();
}, 120_000);

afterAll(() => closeBrowserTest(browser, vite, llamaModel));

/** Two tabs on `serve`'s room; the greedy tokens of the route they form, and the route. */
async function twoTabRoute(serve: ServeInfo, label: string): Promise<{ tokens: number[]; route: any; contexts: BrowserContext[] }> {
  const contexts: BrowserContext[] = [];
  for (const name of [`${label}0`, `${label}1`]) {
    const context = await browser.newContext();
    const page = await context.newPage();
    page.on('console', (m) => m.type() === 'error' && console.log(`[${name}] ${m.text()}`));
    await page.goto(`${pageBase}#${new URLSearchParams({ join: serve.joinUrl, name, memory: String(1 << 30) })}`);
    await waitForPeerState(page, (s) => s.status === 'idle' || s.status === 'ready', `${name} joined`);
    contexts.push(context);
  }
  const route = await waitForRoute(serve, 'ready', 60_000);
  const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
  const c = await RouteSessionClient.open(link, route.id, { contextLength: 64 });
  const tokens = [await c.prefill(promptTokens)];
  while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
  await c.close();
  return { tokens, route, contexts };
}

describe('two browser tabs serve a 3-part split GGUF', () => {
  let split: { tokens: number[]; route: any; contexts: BrowserContext[] };
  let serve: ServeInfo;

  beforeAll(async () => {
    serve = await spawnServe(model.parts[0]!, ['--min-peers', '2']);
    split = await twoTabRoute(serve, 's');
  }, 180_000);
  afterAll(async () => {
    for (const c of split?.contexts ?? []) await c.close();
    await serve?.proc.kill();
  });

  it('gives the same greedy tokens as the same route over the unsplit model (and llama.cpp on it)', async () => {
    expect(split.route.stages.map((s: any) => [s.shard.start, s.shard.end])).toEqual([[0, 2], [2, 4]]);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    expect(peers.map((p: any) => p.backend)).toEqual(['webgpu', 'webgpu']);
    const wholeServe = await spawnServe(model.whole, ['--min-peers', '2']);
    const whole = await twoTabRoute(wholeServe, 'w');
    try {
      expect(whole.route.stages.map((s: any) => [s.shard.start, s.shard.end])).toEqual([[0, 2], [2, 4]]);
      console.log(`[split] split route ${JSON.stringify(split.tokens)}, unsplit route ${JSON.stringify(whole.tokens)}, llama.cpp ${JSON.stringify(llamaTokens)}`);
      expect(split.tokens).toEqual(whole.tokens);
      expect(split.tokens).toEqual(llamaTokens);
    } finally {
      for (const c of whole.contexts) await c.close();
      await wholeServe.proc.kill();
    }
  });

  it('each tab fetched only its shard\'s tensors, from the parts that hold them', async () => {
    const fetches = (await getJson(`${serve.base}/v1/models/stories-split/fetches`, serve.secret)).body.clients;
    for (const st of split.route.stages) {
      const log = fetches[st.peerId];
      expect(log, `no fetches by ${st.peerId}`).toBeDefined();
      const wanted = shardTensors(manifest, st.shard.start, st.shard.end);
      const shardBytes = wanted.reduce((s, t) => s + t.byte_length, 0);
      console.log(`[fetch] stage ${st.stage} layers ${st.shard.start}-${st.shard.end}: ${log.bytes} bytes in ${log.requests} requests over parts ${[...new Set(log.files)].join(',')} for ${shardBytes} shard bytes`);
      expect(new Set(log.files)).toEqual(new Set(wanted.map((t) => t.file)));
      expect(log.bytes).toBeGreaterThanOrEqual(shardBytes);
      expect(log.bytes).toBeLessThanOrEqual(1.02 * shardBytes);
      log.ranges.forEach(([a, b]: [number, number], i: number) => {
        // every byte fetched lies within the span of this shard's tensors in that part
        const inFile = wanted.filter((t) => t.file === log.files[i]);
        expect(a).toBeGreaterThanOrEqual(Math.min(...inFile.map((t) => t.offset)));
        expect(b + 1).toBeLessThanOrEqual(Math.max(...inFile.map((t) => t.offset + t.byte_length)));
      });
    }
  });
});
