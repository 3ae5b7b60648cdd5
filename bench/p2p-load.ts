// `npm run bench -- p2p-load [--tabs 4] [--stages 2] [--layers 8 --embd 512 --ffn 1536 --vocab 2048]`
// Time for N headless Chromium tabs (WebGPU on SwiftShader) to hold a synthetic model's shards —
// a route of `stages` tabs, the rest spares holding a standby shard — and the bytes the
// server's model hosting sent, with shards from other peers (shard-exchange.ts) and without
// (the baseline, the same run, fresh browser contexts: nothing cached). Goal: server bytes ≤
// 1.2 × one copy of the model, whatever the number of tabs; exit code 1 when missed.

import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import type { Browser, Page } from 'playwright-core';
import { createServer } from 'vite';
import { chromiumArgs } from '../vite.config.ts';
import { makeModelFile } from '../src/model/synthetic-model.ts';
import { killAllCli, spawnCli } from './processes.ts';

function arg(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1]! : fallback;
}

async function getJson(url: string, secret: string): Promise<any> {
  return (await fetch(url, { headers: { authorization: `Bearer ${secret}` } })).json();
}

/** One room from scratch: serve, `tabs` fresh contexts, until every tab holds its shard (stage or standby). */
async function loadRoom(browser: Browser, pageBase: string, model: string, tabs: number, stages: number, p2p: boolean): Promise<Record<string, unknown>> {
  const serve = spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', model, '--min-peers', String(stages)]);
  const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/);
  const [, secret] = await serve.waitFor(/secret:\s+(\S+)/);
  const base = new URL(joinUrl!).origin;
  const roomId = new URL(joinUrl!).pathname.split('/').pop()!;
  const pages: Page[] = [];
  const t0 = performance.now();
  try {
    for (let i = 0; i < tabs; i++) {
      const page = await (await browser.newContext()).newPage();
      await page.goto(`${pageBase}#${new URLSearchParams({ join: joinUrl!, name: `t${i}`, memory: String(1 << 30), ...(p2p ? {} : { p2p: 'off' }) })}`);
      pages.push(page);
    }
    // every tab holds a shard: the route's stages ready, every other tab a ready spare
    for (;;) {
      const room = await getJson(`${base}/v1/rooms/${roomId}`, secret!);
      if (room.route?.status === 'ready') {
        const route = await getJson(`${base}/v1/routes/${room.route.id}`, secret!);
        if (route.spares.filter((s: any) => s.status === 'ready').length >= tabs - stages) break;
      }
      if (performance.now() - t0 > 300_000) throw new Error(`tabs never all held a shard: ${JSON.stringify(room)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const ms = performance.now() - t0;
    const fetches = (await getJson(`${base}/v1/models/${encodeURIComponent((await getJson(`${base}/v1/rooms/${roomId}`, secret!)).model.id)}/fetches`, secret!)).clients as Record<string, { bytes: number }>;
    const serverBytes = Object.values(fetches).reduce((a, c) => a + c.bytes, 0);
    const states = await Promise.all(pages.map((p) => p.evaluate(() => JSON.parse(JSON.stringify(window.__peer!.state)))));
    const peerBytes = states.reduce((a: number, s: any) => a + Object.values<number>((s.load ?? s.standby?.load)?.peerBytes ?? {}).reduce((x, y) => x + y, 0), 0);
    return { ms: Math.round(ms), serverBytes, peerBytes };
  } finally {
    for (const p of pages) await p.context().close();
    serve.child.kill('SIGTERM');
    await serve.exited;
  }
}

export async function run(args: string[]): Promise<unknown> {
  const shape = { layers: Number(arg(args, 'layers', '8')), embd: Number(arg(args, 'embd', '512')), ffn: Number(arg(args, 'ffn', '1536')), vocab: Number(arg(args, 'vocab', '2048')), heads: 8 };
  const tabs = Number(arg(args, 'tabs', '4'));
  const stages = Number(arg(args, 'stages', '2'));
  const dir = join(process.cwd(), '.cache');
  mkdirSync(dir, { recursive: true });
  const model = join(dir, `bench-p2p-${shape.layers}x${shape.embd}x${shape.ffn}x${shape.vocab}.gguf`);
  if (!existsSync(model)) await makeModelFile(model, { arch: 'llama', ...shape, ctx: 2048, type: 'q8_0', seed: 11 });
  const modelBytes = (await import('node:fs')).statSync(model).size;
  const vite = await createServer({
    configFile: false,
    root: join(process.cwd(), 'test', 'fixtures', 'peer-page'),
    logLevel: 'warn',
    server: { host: '127.0.0.1', port: 0, hmr: false },
    optimizeDeps: { include: ['comlink', 'simple-peer', 'buffer', 'process', 'idb-keyval'] },
  });
  await vite.listen();
  const pageBase = `http://127.0.0.1:${(vite.httpServer!.address() as { port: number }).port}/`;
  const browser = await chromium.launch({ executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium', args: chromiumArgs });
  try {
    const baseline = await loadRoom(browser, pageBase, model, tabs, stages, false);
    const p2p = await loadRoom(browser, pageBase, model, tabs, stages, true);
    const copies = (p2p.serverBytes as number) / modelBytes;
    const out = {
      model: { ...shape, type: 'q8_0', bytes: modelBytes },
      tabs,
      stages,
      baseline: { ...baseline, copies: Math.round(((baseline.serverBytes as number) / modelBytes) * 100) / 100 },
      p2p: { ...p2p, copies: Math.round(copies * 100) / 100 },
      server_bytes_ratio: Math.round(((p2p.serverBytes as number) / (baseline.serverBytes as number)) * 1000) / 1000,
      time_ratio: Math.round(((p2p.ms as number) / (baseline.ms as number)) * 1000) / 1000,
      goal: { server_copies_max: 1.2, met: copies <= 1.2 },
      load_average: (await import('node:os')).loadavg().map((x) => Math.round(x * 100) / 100),
    };
    if (!out.goal.met) process.exitCode = 1;
    return out;
  } finally {
    await browser.close();
    await vite.close();
    killAllCli();
  }
}
