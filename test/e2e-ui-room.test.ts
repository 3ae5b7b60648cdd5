// The web app end to end: a real `gguf-mesh serve` (default model, made on first start), three
// headless Chromium contexts — one starts a room from the landing page, two open its share
// link — a 3-stage all-browser route forms, and the chat streams the same text the API gives
// for the same prompt. Screenshots of the landing, peer and route views go to test-artifacts/.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, Page } from 'playwright-core';
import { runCli } from './support/cli.ts';
import { killAll } from './support/mesh.ts';
import { artifactPath, ensureBuilt, launchChromium, serveDefault, watchedPage } from './fixtures/ui/harness.ts';
import type { Served } from './fixtures/ui/harness.ts';

const MAX_TOKENS = 20;
let served: Served;
let browser: Browser;
const errors: string[] = [];
const pages: Page[] = [];

/** Labels, names and roles every page of the app must have. */
async function accessibilityProblems(page: Page): Promise<string[]> {
  return page.evaluate(() => {
    const problems: string[] = [];
    if (!document.documentElement.lang) problems.push('html has no lang');
    for (const el of document.querySelectorAll<HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement>('input, textarea, select')) {
      if (el.type === 'radio' && el.closest('label')) continue;
      const named = (el.labels?.length ?? 0) > 0 || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
      if (!named) problems.push(`unlabelled ${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ''} (${el.className})`);
    }
    for (const b of document.querySelectorAll('button')) if (!(b.textContent ?? '').trim() && !b.getAttribute('aria-label')) problems.push('button without a name');
    for (const s of document.querySelectorAll('[role=img]')) if (!s.getAttribute('aria-label')) problems.push('image without a label');
    for (const p of document.querySelectorAll('[role=progressbar]')) if (!p.getAttribute('aria-label')) problems.push('progress bar without a label');
    return problems;
  });
}

async function waitForRoute(stages: number, timeoutMs = 90_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  const auth = { authorization: `Bearer ${served.secret}` };
  for (;;) {
    const room = (await (await fetch(`${served.base}/v1/rooms/${served.roomId}`, { headers: auth })).json()) as any;
    if (room.route?.status === 'ready') {
      const route = (await (await fetch(`${served.base}/v1/routes/${room.route.id}`, { headers: auth })).json()) as any;
      if (route.stages.length === stages) return route;
    }
    if (Date.now() > deadline) throw new Error(`no ready ${stages}-stage route: ${JSON.stringify(room)}\n${served.proc.output()}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The same prompt through the server's API: OpenAI chat completions when served, else `generate --join`. */
async function apiText(promptText: string): Promise<{ via: string; text: string }> {
  const res = await fetch(`${served.base}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${served.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gguf-mesh-default', messages: [{ role: 'user', content: 'Hello there' }], max_tokens: MAX_TOKENS, temperature: 0 }),
  });
  if (res.status !== 404) {
    const body = (await res.json()) as any;
    expect(res.status, JSON.stringify(body)).toBe(200);
    return { via: 'POST /v1/chat/completions', text: body.choices[0].message.content };
  }
  const r = await runCli(['generate', '--join', served.joinUrl, '--prompt', promptText, '--n', String(MAX_TOKENS), '--json']);
  expect(r.code, r.stderr).toBe(0);
  return { via: 'gguf-mesh generate --join', text: (JSON.parse(r.stdout) as { text: string }).text };
}

beforeAll(async () => {
  await ensureBuilt();
  // no spare in this room: a stage that leaves is given up after a short repair wait
  served = await serveDefault(['--min-peers', '3', '--plan-delay', '1500', '--repair-timeout', '3000']);
  browser = await launchChromium();
}, 240_000);

afterAll(async () => {
  await browser?.close();
  await killAll();
});

describe('web app: room, peers, route, chat', () => {
  it('npm start prints the page URL (the admin secret in its fragment) and the join URL with its secret in the fragment', () => {
    expect(served.pageUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/#admin=[A-Za-z0-9_%-]+$/);
    expect(served.joinUrl).toBe(`${served.base}/room/${served.roomId}#secret=${encodeURIComponent(served.secret)}`);
    expect(served.proc.output()).toMatch(/model gguf-mesh-default \(6 layers\): synthetic llama q8_0/);
  });

  it('starts a room from the landing page, forms a 3-stage browser route from the share link, and chats', async () => {
    const a = await watchedPage(browser, errors, 'starter');
    pages.push(a.page);
    await a.page.goto(served.pageUrl);
    await a.page.getByText('gguf-mesh-default', { exact: true }).waitFor();
    await a.page.screenshot({ path: artifactPath('ui-landing.png'), fullPage: true });
    expect(await accessibilityProblems(a.page)).toEqual([]);

    await a.page.getByRole('button', { name: 'Start a room' }).click();
    await a.page.waitForURL(/\/room\//);
    expect(a.page.url()).toBe(served.joinUrl);
    const shared = await a.page.getByLabel('room link to open on other devices').inputValue();
    expect(shared).toBe(served.joinUrl);
    await expect.poll(() => a.page.locator('.qr svg').count()).toBe(1);

    for (const label of ['second', 'third']) {
      const p = await watchedPage(browser, errors, label);
      pages.push(p.page);
      await p.page.goto(shared);
    }
    const route = await waitForRoute(3);
    expect(route.stages.map((s: any) => [s.shard.start, s.shard.end])).toEqual([[0, 2], [2, 4], [4, 6]]);
    for (const p of pages) await p.getByText('Serving its layers').waitFor({ timeout: 60_000 });
    await expect.poll(() => a.page.locator('.route-picture svg g.stage-ready').count(), { timeout: 10_000 }).toBe(3);
    await pages[1]!.locator('.peer-view').screenshot({ path: artifactPath('ui-peer.png') });
    expect(await pages[1]!.locator('.peer-view [role=progressbar]').getAttribute('aria-valuenow')).toBe('100');
    // the budget was measured (no budget typed in), and the cache's storage is described
    const facts = await pages[1]!.locator('.peer-view .facts').innerText();
    expect(facts).toMatch(/Memory budget\s+[\d.]+ \w+ \(measured: held [\d.]+ \w+, stopped by/);
    expect(facts).toMatch(/Storage\s+(persistent|not persistent)[^\n]* of [\d.]+ \w+ used/);
    expect(facts).toMatch(/Awake\s+screen kept awake while serving/);

    // sampler settings, then the chat by keyboard only: Tab to the message box, Enter sends
    await a.page.getByText('Sampler settings').click();
    await a.page.getByLabel('Max tokens').fill(String(MAX_TOKENS));
    await a.page.getByLabel('Max tokens').press('Tab');
    await a.page.evaluate(() => (document.activeElement as HTMLElement | null)?.blur());
    let reached = false;
    for (let i = 0; i < 80 && !reached; i++) {
      await a.page.keyboard.press('Tab');
      reached = await a.page.evaluate(() => document.activeElement?.tagName === 'TEXTAREA');
    }
    expect(reached, 'Tab reaches the message box').toBe(true);
    await a.page.evaluate(() => {
      const w = window as unknown as { __updates: number };
      w.__updates = 0;
      new MutationObserver(() => w.__updates++).observe(document.querySelector('.messages')!, { subtree: true, childList: true, characterData: true });
    });
    await a.page.keyboard.type('Hello there');
    await a.page.keyboard.press('Enter');
    await a.page.getByText(/stopped:/).waitFor({ timeout: 90_000 });
    const reply = await a.page.locator('.msg-assistant .text').last().textContent();
    const promptText = await a.page.locator('.prompt-text').textContent();
    const updates = await a.page.evaluate(() => (window as unknown as { __updates: number }).__updates);
    expect(promptText).toBe('<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n');
    expect(reply!.length).toBeGreaterThan(0);
    expect(updates, 'the reply arrived in several pieces').toBeGreaterThan(3);
    const api = await apiText(promptText!);
    expect(reply, `page vs ${api.via}`).toBe(api.text);
    console.info(`chat reply (${reply!.length} chars) equals ${api.via}`);

    // per-stage step timings from the stages' timing trailer, drawn in the route picture
    await expect.poll(() => a.page.locator('.route-picture .stage-time').allTextContents()).toEqual([expect.stringMatching(/\/ step$/), expect.stringMatching(/\/ step$/), expect.stringMatching(/\/ step$/)]);
    await expect.poll(() => a.page.locator('.route-picture rect.time-compute').count()).toBe(3);
    const stats = await a.page.locator('.stats').innerText();
    console.info(`route view (3 SwiftShader tabs): ${stats.replace(/\s*\n\s*/g, ' | ')} | per stage: ${(await a.page.locator('.route-picture .stage-time').allTextContents()).join(', ')}`);
    // hidden states as f16: n_embd 128 × 2 bytes + the frame's header and trailer, per token per hop
    const perToken = /Bytes per token per hop\s*(\d+) B · (\d+) B/i.exec(stats);
    expect(perToken, stats).not.toBeNull();
    for (const b of perToken!.slice(1).map(Number)) expect(b).toBeGreaterThanOrEqual(256);

    await a.page.getByText(/Decode/).waitFor();
    await expect.poll(() => a.page.locator('.stats').innerText()).toMatch(/TIME TO FIRST TOKEN\s*\n?\s*[\d.]+ (ms|s)/i);
    await a.page.locator('.route-view').screenshot({ path: artifactPath('ui-route.png') });
    await a.page.screenshot({ path: artifactPath('ui-room.png'), fullPage: true });
    expect(await accessibilityProblems(a.page)).toEqual([]);
    expect(errors).toEqual([]);
  }, 300_000);

  it('stop ends a streaming reply; a stage that leaves mid-reply shows as an error naming it', async () => {
    const a = pages[0]!;
    await a.getByLabel('Max tokens').fill('400');
    await a.getByLabel('Max tokens').press('Tab');
    const message = a.getByLabel('Message');
    await message.fill('Tell me more');
    await message.press('Enter');
    await a.locator('.msg-assistant[data-streaming=true] .text').filter({ hasText: /.{8}/ }).waitFor();
    await a.getByRole('button', { name: 'Stop' }).click();
    await a.getByText(/stopped: aborted/).waitFor();
    expect(await a.getByRole('button', { name: 'Stop' }).isDisabled()).toBe(true);

    expect(errors).toEqual([]);
    await message.fill('And again');
    await message.press('Enter');
    await a.locator('.msg-assistant[data-streaming=true] .text').filter({ hasText: /.{8}/ }).waitFor();
    await pages[2]!.getByRole('button', { name: 'Leave' }).click();
    const alert = a.locator('.chat-view .error[role=alert]');
    await alert.waitFor({ timeout: 30_000 });
    const text = await alert.innerText();
    console.info(`chat error after stage 2 left: ${text}`);
    expect(text).toMatch(/stage 2/);
    await expect.poll(() => a.locator('.route-picture g[data-stage="2"]').getAttribute('class')).toMatch(/stage-(failed|lost)/);
    await a.locator('.route-view').screenshot({ path: artifactPath('ui-route-failed.png') });
    await pages[2]!.getByText('Left the room').waitFor();
    await expect
      .poll(async () => ((await (await fetch(`${served.base}/v1/rooms/${served.roomId}`, { headers: { authorization: `Bearer ${served.secret}` } })).json()) as any).route?.status, { timeout: 20_000 })
      .not.toBe('ready');
    // the browser itself logs each HTTP error status of the failure (the failed step, the refused
    // close, the session lookup); nothing else may reach the console
    expect(errors.filter((e) => !/^starter console: Failed to load resource: the server responded with a status of [45]\d\d/.test(e))).toEqual([]);
  }, 120_000);
});
