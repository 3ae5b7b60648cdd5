// A synthetic qwen35moe (Gated DeltaNet blocks, gated attention, MoE with a sigmoid-gated
// shared expert) served split over a browser tab (WebGPU on SwiftShader in headless Chromium,
// its DeltaNet state on the GPU) and a native CPU node: the route's greedy tokens are
// llama.cpp's on the whole file, over a prompt longer than one 32-token chunk; and when the
// native node is killed mid-stream, a spare rebuilds its stage (DeltaNet state included) from the
// hidden states the tab logged, and the streamed text is llama.cpp's greedy text.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { PROMPT } from './support/arch-cases.ts';
import { closeBrowserTest, joinTab, launchChromium, startPeerPage } from './support/browser-route.ts';
import { LlamaModelFfi, oracleGreedy } from './support/llamacpp-oracle.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';
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

const MODEL = { arch: 'qwen35moe', layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512, expertFfn: 256, sharedFfn: 256, linearKHeads: 2, linearVHeads: 4, linearHeadDim: 32 } as const;

describe('qwen35moe over a browser tab and a native node', () => {
  it('tab (WebGPU) + CPU node: one route, llama.cpp\'s greedy tokens', async () => {
    const model = await syntheticModel(MODEL);
    const oracle = await LlamaModelFfi.load(model);
    const prompt = oracle.tokenize(`${PROMPT} ${PROMPT}`);
    const expected = oracleGreedy(oracle, prompt, N).tokens;
    oracle.dispose();
    expect(prompt.length).toBeGreaterThan(32);
    const serve = await spawnServe(model, ['--min-peers', '2']);
    try {
      ({ context } = await joinTab(browser, pageBase, serve.joinUrl));
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

describe('qwen35moe over a tab and a native node, the node killed mid-stream', () => {
  it('a spare CPU node rebuilds the last stage from the tab\'s logged hidden states: llama.cpp\'s greedy text', async () => {
    const model = await syntheticModel(MODEL);
    const text = 'The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks were striking thirteen.';
    const greedy = { prompt: text, max_tokens: 60, temperature: 0 };
    const tokenizer = Tokenizer.fromMetadata((await readHeader(model)).metadata);
    const oracle = await LlamaModelFfi.load(model);
    const ref = oracleGreedy(oracle, oracle.tokenize(text), greedy.max_tokens).tokens;
    oracle.dispose();
    const eog = ref.findIndex((t) => tokenizer.isEog(t));
    const reference = tokenizer.decode(eog < 0 ? ref : ref.slice(0, eog));
    const serve = await spawnServe(model, ['--min-peers', '2', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '8000']);
    try {
      const { context: ctx } = await joinTab(browser, pageBase, serve.joinUrl);
      const node = (name: string) => spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', name]);
      const first = node('cpu0');
      await first.waitFor(/joined room/);
      await waitForRoute(serve, 'ready', 90_000);
      node('cpu1'); // the spare
      const deadline = Date.now() + 60_000;
      for (;;) {
        const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
        const r = room.route ? (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body : null;
        if (r?.status === 'ready' && r.spares.some((sp: any) => sp.stage === 1 && sp.status === 'ready')) {
          expect(r.stages.map((st: any) => st.peer.backend)).toEqual(['webgpu', 'cpu']);
          break;
        }
        if (Date.now() > deadline) throw new Error(`no spare for the CPU stage: ${JSON.stringify(r)}`);
        await new Promise((res) => setTimeout(res, 100));
      }
      let fired: Promise<unknown> | null = null;
      const out = await streamCompletion(serve.base, serve.secret, greedy, (n) => {
        if (n === 25) fired = first.kill('SIGKILL');
      });
      expect(fired, `only ${out.chunks} chunks`).not.toBeNull();
      await fired;
      expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
      const repaired = out.events.filter((e) => e.type === 'route_repaired');
      expect(repaired.length, JSON.stringify(out.events.map((e) => e.type))).toBeGreaterThanOrEqual(1);
      console.log(`qwen35moe tab + cpu, cpu killed: ${JSON.stringify({ tokensReplayed: repaired[0].tokensReplayed, bytesReplayed: repaired[0].bytesReplayed })}`);
      expect(out.text).toBe(reference);
      await ctx.close();
    } finally {
      await serve.proc.kill();
    }
  });
});
