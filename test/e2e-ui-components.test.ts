// The web components from the built bundle on a page of its own: one <script type="module"> tag,
// a <gguf-mesh-peer> that joins the room and serves the whole route, a <gguf-mesh-chat> that
// generates through it — events ready/progress/token/done, styling by CSS custom properties.
// Then a Chromium without WebGPU opens the room page: it says so and still chats as a client.
import { createReadStream, existsSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, normalize } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium } from 'playwright-core';
import type { Browser, Page } from 'playwright-core';
import { chromiumArgs } from '../vite.config.ts';
import { REPO_ROOT } from './support/cli.ts';
import { killAll } from './support/mesh.ts';
import { artifactPath, ensureBuilt, launchChromium, serveDefault, watchedPage } from './fixtures/ui/harness.ts';
import type { Served } from './fixtures/ui/harness.ts';

interface Recorded {
  source: 'peer' | 'chat';
  type: string;
  detail: any;
}

let served: Served;
/** another origin: a site of its own hosting the page and a copy of the bundle */
let site: Server;
let siteUrl: string;
let browser: Browser;
let embed: Page;
const errors: string[] = [];

const eventsOf = (page: Page): Promise<Recorded[]> => page.evaluate(() => (window as unknown as { __events: Recorded[] }).__events ?? []);

beforeAll(async () => {
  await ensureBuilt();
  served = await serveDefault(['--min-peers', '1', '--plan-delay', '300']);
  browser = await launchChromium();
  const html = readFileSync(join(REPO_ROOT, 'test', 'fixtures', 'ui', 'embed.html'), 'utf8');
  const chatOnly = readFileSync(join(REPO_ROOT, 'test', 'fixtures', 'ui', 'chat-only.html'), 'utf8');
  const bundle = join(REPO_ROOT, 'dist', 'components');
  site = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (path === '/embed.html') return void res.writeHead(200, { 'content-type': 'text/html' }).end(html);
    if (path === '/chat-only.html') return void res.writeHead(200, { 'content-type': 'text/html' }).end(chatOnly);
    const file = normalize(join(bundle, path.replace(/^\/components\//, '')));
    if (path.startsWith('/components/') && file.startsWith(bundle) && existsSync(file)) {
      res.writeHead(200, { 'content-type': file.endsWith('.js') ? 'text/javascript' : 'application/json' });
      return void createReadStream(file).pipe(res);
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((r) => site.listen(0, '127.0.0.1', r));
  siteUrl = `http://127.0.0.1:${(site.address() as AddressInfo).port}`;
}, 240_000);

afterAll(async () => {
  await new Promise((r) => site?.close(r));
  await browser?.close();
  await killAll();
});

describe('web components from the built bundle', () => {
  it('a page with one script tag: the peer element serves the route and the chat element generates tokens', async () => {
    const { page } = await watchedPage(browser, errors, 'embed');
    embed = page;
    // a page on another origin, with the bundle copied beside it (browsers start module workers
    // only from the page's own origin); it talks to the signaling server across origins
    await page.goto(`${siteUrl}/embed.html#room=${encodeURIComponent(served.joinUrl)}`);

    await expect.poll(async () => (await eventsOf(page)).filter((e) => e.type === 'ready').map((e) => e.source).sort(), { timeout: 90_000 }).toEqual(['chat', 'peer']);
    const events = await eventsOf(page);
    const peerReady = events.find((e) => e.source === 'peer' && e.type === 'ready')!;
    expect(peerReady.detail).toMatchObject({ stage: 0, shard: { start: 0, end: 6 }, hop: 'none' });
    expect(events.some((e) => e.source === 'peer' && e.type === 'progress' && e.detail.phase === 'load' && e.detail.totalBytes > 0)).toBe(true);

    // properties: send() resolves with the reply; token events carry the same text in pieces
    const reply = await page.evaluate(() => document.querySelector('gguf-mesh-chat')!.send('Hi'));
    const after = await eventsOf(page);
    const tokens = after.filter((e) => e.source === 'chat' && e.type === 'token');
    expect(tokens.length).toBeGreaterThan(1);
    expect(tokens.map((e) => e.detail.text).join('')).toBe(reply);
    const done = after.find((e) => e.source === 'chat' && e.type === 'done')!;
    expect(done.detail.stats.generatedTokens).toBe(12);
    expect(after.filter((e) => e.type === 'error')).toEqual([]);
    expect(await page.evaluate(() => document.querySelector('gguf-mesh-chat')!.messages.map((m) => m.role))).toEqual(['user', 'assistant']);

    // styling through custom properties reaches into the shadow root
    const sendBg = await page.evaluate(() => getComputedStyle(document.querySelector('gguf-mesh-chat')!.shadowRoot!.querySelector('button.primary')!).backgroundColor);
    expect(sendBg).toBe('rgb(194, 65, 12)');
    await page.screenshot({ path: artifactPath('ui-components.png'), fullPage: true });
    expect(errors).toEqual([]);
  }, 180_000);

  it('the chat element runs from the bundle the gguf-mesh server hosts, loaded by a page of another origin', async () => {
    const { page } = await watchedPage(browser, errors, 'chat-only');
    await page.goto(`${siteUrl}/chat-only.html#bundle=${encodeURIComponent(`${served.base}/components/gguf-mesh.js`)}&room=${encodeURIComponent(served.joinUrl)}`);
    await expect.poll(async () => (await eventsOf(page)).some((e) => e.type === 'ready'), { timeout: 30_000 }).toBe(true);
    const reply = await page.evaluate(() => document.querySelector('gguf-mesh-chat')!.send('Hello'));
    const tokens = (await eventsOf(page)).filter((e) => e.type === 'token');
    expect(tokens.length).toBeGreaterThan(1);
    expect(tokens.map((e) => e.detail.text).join('')).toBe(reply);
    expect(errors).toEqual([]);
  }, 60_000);

  it('a browser without WebGPU says so, offers the CPU engine instead, and still chats', async () => {
    const noGpu = await chromium.launch({ executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium', args: chromiumArgs.filter((a) => a !== '--enable-unsafe-webgpu'), headless: true });
    try {
      const context = await noGpu.newContext({ viewport: { width: 1280, height: 900 } });
      // no WebGPU at all: some browsers still lack navigator.gpu
      await context.addInitScript(() => Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined, configurable: true }));
      const page = await context.newPage();
      const own: string[] = [];
      page.on('console', (m) => m.type() === 'error' && own.push(m.text()));
      page.on('pageerror', (e) => own.push(e.message));
      await page.goto(served.joinUrl);
      await page.getByText(/No WebGPU here/).waitFor();
      await page.getByText(/serves layers on the CPU engine/).waitFor();
      await page.getByLabel('Message').fill('Hello');
      await page.getByLabel('Message').press('Enter');
      await page.getByText(/stopped:/).waitFor({ timeout: 60_000 });
      expect((await page.locator('.msg-assistant .text').last().textContent())!.length).toBeGreaterThan(0);
      await page.screenshot({ path: artifactPath('ui-no-webgpu.png'), fullPage: true });
      expect(own).toEqual([]);
    } finally {
      await noGpu.close();
    }
    expect(embed).toBeTruthy();
  }, 120_000);
});
