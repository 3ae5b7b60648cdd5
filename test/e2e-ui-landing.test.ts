// The landing page's other path: paste the URL of a GGUF on a third-party host (Range + CORS),
// start a room for it, land on the room page, and serve it from this tab. Plus what the landing
// page shows to a device that is not the server's machine: no secrets.
import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser } from 'playwright-core';
import { stories260K } from './support/models.ts';
import { killAll } from './support/mesh.ts';
import { artifactPath, ensureBuilt, launchChromium, serveDefault, startCorsModelHost, watchedPage } from './fixtures/ui/harness.ts';
import type { Served } from './fixtures/ui/harness.ts';

let served: Served;
let browser: Browser;
let host: { url: string; close(): Promise<void> };
const errors: string[] = [];

beforeAll(async () => {
  await ensureBuilt();
  served = await serveDefault();
  host = await startCorsModelHost('/tinyllamas/stories260K.gguf', await stories260K());
  browser = await launchChromium();
}, 240_000);

afterAll(async () => {
  await browser?.close();
  await host?.close();
  await killAll();
});

describe('landing page', () => {
  it('a pasted GGUF URL opens a room for it; the tab serves it and chats', async () => {
    const { page } = await watchedPage(browser, errors, 'landing');
    await page.goto(served.pageUrl);
    await page.getByRole('button', { name: 'stories260K on Hugging Face' }).click();
    expect(await page.getByLabel('GGUF URL').inputValue()).toMatch(/^https:\/\/huggingface\.co\/.*stories260K\.gguf$/);
    await page.getByLabel('GGUF URL').fill(host.url);
    await page.getByLabel('GGUF URL').press('Enter');
    await page.waitForURL(/\/room\/[^/]+#secret=/, { timeout: 60_000 });
    // the room lives on the same server (one port), beside the default model's room
    const opened = new URL(page.url());
    expect(opened.origin).toBe(new URL(served.pageUrl).origin);
    const openedId = opened.pathname.split('/').pop()!;
    const listed = (await (await fetch(`${served.base}/app/rooms`)).json()) as { rooms: Array<{ roomId: string; model: { id: string; remote: boolean } }> };
    expect(listed.rooms.map((r) => r.roomId)).toEqual([served.roomId, openedId]);
    expect(listed.rooms[1]!.model).toMatchObject({ id: 'stories260K', remote: true });
    const openedSecret = decodeURIComponent(opened.hash.replace(/^#secret=/, ''));
    const summary = await fetch(`${served.base}/v1/rooms/${openedId}`, { headers: { authorization: `Bearer ${openedSecret}` } });
    expect(summary.status).toBe(200);
    await page.getByText(/model stories260K · 5 layers/).waitFor({ timeout: 30_000 });
    await page.getByText('Serving its layers').waitFor({ timeout: 60_000 });
    await page.getByLabel('Message').fill('Once upon a time');
    await page.getByLabel('Message').press('Enter');
    await page.getByText(/stopped:/).waitFor({ timeout: 60_000 });
    expect((await page.locator('.msg-assistant .text').last().textContent())!.length).toBeGreaterThan(0);
    await page.screenshot({ path: artifactPath('ui-pasted-url-room.png'), fullPage: true });
    expect(errors).toEqual([]);
  }, 180_000);

  it('lists rooms with join links only to the server machine presenting the admin secret, and refuses non-URLs', async () => {
    const admin = { authorization: `Bearer ${decodeURIComponent(new URL(served.pageUrl).hash.replace('#admin=', ''))}` };
    const rooms = (await (await fetch(`${served.base}/app/rooms`, { headers: admin })).json()) as { local: boolean; rooms: Array<{ joinUrl?: string; model: { id: string } }> };
    expect(rooms.local).toBe(true);
    expect(rooms.rooms.map((r) => r.model.id)).toContain('gguf-mesh-default');
    expect(rooms.rooms.every((r) => r.joinUrl?.includes('#secret='))).toBe(true);
    // any other process on this machine (no admin secret) sees the rooms but no links
    const anyone = (await (await fetch(`${served.base}/app/rooms`)).json()) as { local: boolean; rooms: Array<{ joinUrl?: string }> };
    expect(anyone.local).toBe(false);
    expect(anyone.rooms.some((r) => r.joinUrl)).toBe(false);
    const bad = await fetch(`${served.base}/app/rooms`, { method: 'POST', headers: { 'content-type': 'application/json', ...admin }, body: JSON.stringify({ model: '/etc/passwd' }) });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe('BAD_REQUEST');
    // a cross-site form post (no JSON content type) opens nothing
    const form = await fetch(`${served.base}/app/rooms`, { method: 'POST', headers: { 'content-type': 'text/plain', ...admin }, body: JSON.stringify({ model: host.url }) });
    expect(form.status).toBe(400);
    // a rebinding DNS name reaching this machine sees rooms but no secrets
    const rebound = await new Promise<string>((resolve, reject) => {
      const req = httpRequest(`${served.base}/app/rooms`, { headers: { host: 'evil.example:80', ...admin } }, (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve(body));
      });
      req.on('error', reject);
      req.end();
    });
    expect(JSON.parse(rebound).local).toBe(false);
    expect(rebound).not.toContain('secret=');
    // the API stays behind the secret: the app's paths never open it
    expect((await fetch(`${served.base}/v1/rooms`)).status).toBe(401);
    expect((await fetch(`${served.base}/models/gguf-mesh-default.gguf`)).status).toBe(401);
  });
});
