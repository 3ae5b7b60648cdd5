// `npm run bench -- browser-cpu [--rounds 4] [--decode 16] [--prompt 64]`: the CPU engine as a
// tab without WebGPU runs it — headless Chromium launched without WebGPU, the engine in a
// dedicated worker (single-threaded: the page is not cross-origin isolated) — against the Node
// CPU engine on one thread, on the same shards, rounds interleaved, best of each kept. Shards:
// the route bench's f32 model (6 × 512, whole) and the first half of the ~250M Q8_0 model.
// Goal: the tab decodes at ≥ 0.5× the Node engine on each.

import { existsSync, mkdirSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { createServer } from 'vite';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { makeModelFile } from '../src/model/synthetic-model.ts';
import { chromiumArgs } from '../vite.config.ts';
import { syntheticModel } from '../test/support/synthetic.ts';
import { best, finishLoad, goal, machineLoad, round2 } from './lib/goals.ts';
import type { CpuBenchRequest, CpuBenchResult } from './fixtures/cpu-page/main.ts';

function arg(args: string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

interface Case {
  name: string;
  path: string;
  end: number;
}

/** the Node engine on one thread over layers [0, end), loaded once; each call times one round */
async function nodeStage(path: string, end: number): Promise<{ round: (prompt: number[], decode: number) => Promise<{ prefillMs: number; decodeMs: number }>; close: () => Promise<void> }> {
  const source = await openTensorSource(path);
  const b = createNodeCpuBackend({ threads: 1 });
  await b.load(source, { start: 0, end });
  return {
    async round(prompt, decode) {
      await b.openSession('bench', { contextLength: prompt.length + decode + 1 });
      let t0 = performance.now();
      await b.forward('bench', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0);
      const prefillMs = performance.now() - t0;
      t0 = performance.now();
      for (let i = 0; i < decode; i++) await b.forward('bench', { kind: 'tokens', tokens: Int32Array.of(prompt[i % prompt.length]!) }, prompt.length + i);
      const decodeMs = (performance.now() - t0) / decode;
      await b.releaseSession('bench');
      return { prefillMs, decodeMs };
    },
    close: async () => (await b.dispose(), await source.close()),
  };
}

export async function run(args: string[]): Promise<unknown> {
  const rounds = arg(args, 'rounds', 4);
  const decode = arg(args, 'decode', 16);
  const nPrompt = arg(args, 'prompt', 64);
  const load = machineLoad();
  const routeModel = join(process.cwd(), '.cache', 'bench-route-6x512x1536x2048.gguf');
  if (!existsSync(routeModel)) await makeModelFile(routeModel, { arch: 'llama', layers: 6, embd: 512, ffn: 1536, vocab: 2048, heads: 8, ctx: 4096, type: 'f32', seed: 7 });
  const cases: Case[] = [
    { name: 'route bench model, f32 6×512, layers 0-6', path: routeModel, end: 6 },
    { name: 'synthetic llama Q8_0 1024×16 (~250M), layers 0-8', path: await syntheticModel({ arch: 'llama', type: 'q8_0', layers: 16, embd: 1024, heads: 16, kvHeads: 4, ffn: 2816, vocab: 32000 }), end: 8 },
  ];
  // the page and the models, served by one vite dev server (Range requests for the GGUFs)
  const publicDir = join(process.cwd(), '.cache', 'bench-cpu-page');
  rmSync(publicDir, { recursive: true, force: true });
  mkdirSync(publicDir, { recursive: true });
  cases.forEach((c, i) => symlinkSync(c.path, join(publicDir, `m${i}.gguf`)));
  const vite = await createServer({
    configFile: false,
    root: join(process.cwd(), 'bench', 'fixtures', 'cpu-page'),
    publicDir,
    logLevel: 'warn',
    server: { host: '127.0.0.1', port: 0, hmr: false },
    optimizeDeps: { include: ['comlink', '@huggingface/gguf'] },
  });
  await vite.listen();
  const base = `http://127.0.0.1:${(vite.httpServer!.address() as { port: number }).port}`;
  const browser = await chromium.launch({ executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium', args: chromiumArgs.filter((a) => a !== '--enable-unsafe-webgpu') });
  const results = [];
  try {
    const page = await browser.newPage();
    await page.goto(`${base}/`);
    await page.waitForFunction(() => typeof window.benchCpu === 'function', undefined, { timeout: 60_000 });
    const hasGpu = await page.evaluate(async () => Boolean(await (navigator as Navigator & { gpu?: GPU }).gpu?.requestAdapter()));
    for (const [i, c] of cases.entries()) {
      const prompt = Array.from({ length: nPrompt }, (_, k) => 1 + ((k * 37) % 2000));
      const req: CpuBenchRequest = { url: `${base}/m${i}.gguf`, end: c.end, prompt, decode };
      const tab: CpuBenchResult[] = [];
      const node: { prefillMs: number; decodeMs: number }[] = [];
      const stage = await nodeStage(c.path, c.end);
      for (let r = 0; r < rounds; r++) {
        tab.push(await page.evaluate((q) => window.benchCpu(q), req));
        node.push(await stage.round(prompt, decode));
      }
      await stage.close();
      const tabDecode = best(tab.map((x) => x.decodeMs));
      const nodeDecode = best(node.map((x) => x.decodeMs));
      results.push({
        shard: c.name,
        tab: { threads: tab[0]!.threads, relaxed_simd: tab[0]!.relaxedSimd, cross_origin_isolated: tab[0]!.isolated, webgpu_adapter: hasGpu, decode_ms: round2(tabDecode), prefill_tok_s: round2((nPrompt * 1000) / best(tab.map((x) => x.prefillMs))) },
        node_one_thread: { decode_ms: round2(nodeDecode), prefill_tok_s: round2((nPrompt * 1000) / best(node.map((x) => x.prefillMs))) },
        decode_ratio_tab_vs_node: round2(nodeDecode / tabDecode),
      });
    }
  } finally {
    await browser.close();
    await vite.close();
  }
  return {
    note: 'ms per decode step and prompt tok/s, best of interleaved rounds; the tab is Chromium without WebGPU running the CPU engine in a dedicated worker; Node runs the same engine on one thread',
    machine: finishLoad(load),
    results,
    goals: results.map((r) => goal(`tab decode / Node decode (${r.shard})`, r.decode_ratio_tab_vs_node, 'min', 0.5)),
  };
}
