// Shared by the browser-peer end-to-end tests: the test peer page (test/fixtures/peer-page)
// served by a vite dev server, headless Chromium (WebGPU on SwiftShader) to open it in, and
// polling a tab's peer state until it reaches what a test waits for.
import { join } from 'node:path';
import { expect } from 'vitest';
import { chromium } from 'playwright-core';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { createServer } from 'vite';
import type { ViteDevServer } from 'vite';
import type { LlamaModel } from 'node-llama-cpp';
import { chromiumArgs } from '../../vite.config.ts';
import type { BrowserPeerState } from '../../src/peer/browser-peer.ts';
import { buildManifest } from '../../src/gguf/manifest.ts';
import type { Manifest } from '../../src/gguf/verify.ts';
import { REPO_ROOT } from './cli.ts';
import { greedyGenerate, loadModel } from './llama.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './models.ts';
import { killAll } from './mesh.ts';

/** A vite dev server for the peer page on a free loopback port; `pageBase` is its root URL. */
export async function startPeerPage(): Promise<{ vite: ViteDevServer; pageBase: string }> {
  const vite = await createServer({
    configFile: false,
    root: join(REPO_ROOT, 'test', 'fixtures', 'peer-page'),
    logLevel: 'warn',
    server: { host: '127.0.0.1', port: 0, strictPort: false, hmr: false },
    optimizeDeps: { include: ['comlink', 'simple-peer', 'buffer', 'process', 'idb-keyval'] },
  });
  await vite.listen();
  const addr = vite.httpServer!.address() as { port: number };
  return { vite, pageBase: `http://127.0.0.1:${addr.port}/` };
}

/** Headless Chromium with the project's WebGPU flags; launch() gives it a fresh temporary profile, and each context is isolated storage. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium', args: chromiumArgs });
}

/** What the browser-route tests check against: stories260K, its manifest, llama.cpp on it, and its greedy continuation of the standard prompt (`n` tokens). */
export async function storiesOracle(n: number): Promise<{ modelPath: string; manifest: Manifest; llamaModel: LlamaModel; expected: number[] }> {
  const modelPath = await stories260K();
  const manifest = await buildManifest(modelPath);
  const llamaModel = await loadModel(modelPath);
  return { modelPath, manifest, llamaModel, expected: await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, n) };
}

/** afterAll: closes the browser, the page server and the llama.cpp oracle (any may be unset when beforeAll failed early), kills every spawned process. */
export async function closeBrowserTest(browser: Browser | undefined, vite: ViteDevServer | undefined, oracle: LlamaModel | undefined): Promise<void> {
  await browser?.close();
  await vite?.close();
  await oracle?.dispose();
  await killAll();
}

/** The tab's peer state (a plain copy), or null before the page made its peer. */
export async function peerState(page: Page): Promise<BrowserPeerState | null> {
  return page.evaluate(() => (window.__peer ? JSON.parse(JSON.stringify(window.__peer.state)) : null));
}

/** Polls the tab's peer state until `ok`; fails with the page's log on a page error or after `timeoutMs`. */
export async function waitForPeerState(page: Page, ok: (s: BrowserPeerState) => boolean, what: string, timeoutMs = 45_000): Promise<BrowserPeerState> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const s = await peerState(page);
    if (s && ok(s)) return s;
    const err = await page.evaluate(() => window.__peerError ?? null);
    if (err || Date.now() > deadline) {
      const log = await page.evaluate(() => window.__peerLog.join('\n'));
      throw new Error(`${what}: not reached (${JSON.stringify(err ?? s?.status)}); page log:\n${log}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A new context and page in `browser` that opens the peer page joined to `joinUrl` as `name` (1 GiB), once it has joined; page errors are logged. */
export async function joinTab(browser: Browser, pageBase: string, joinUrl: string, name = 'tab'): Promise<{ context: BrowserContext; page: Page }> {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on('console', (m) => m.type() === 'error' && console.log(`[${name}] ${m.text()}`));
  await page.goto(`${pageBase}#${new URLSearchParams({ join: joinUrl, name, memory: String(1 << 30) })}`);
  await waitForPeerState(page, (s) => s.status === 'idle' || s.status === 'ready', `${name} joined`);
  return { context, page };
}

/**
 * A data channel's candidate pair is direct: UDP with no relay candidate at either end. ICE may
 * nominate a server-reflexive candidate where serve's STUN reflects a peer's own address (no NAT
 * between them) — the same path as its host candidate, whose mDNS name the other end may not have
 * resolved first — so which of the two wins is the browser's race, not the test's question.
 */
export function expectDirectPair(pair: { local: string; remote: string; protocol: string } | null | undefined): void {
  expect(pair).toMatchObject({ protocol: 'udp' });
  expect(['host', 'srflx', 'prflx']).toContain(pair!.local);
  expect(['host', 'srflx', 'prflx']).toContain(pair!.remote);
}
