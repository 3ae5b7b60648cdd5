// A room in a lab (test/support/netns.ts): `serve` bound to a lab host's address (HTTPS with its
// local CA there), the room page opened in lab Chromium tabs (test/support/lab-browser.ts), the
// room's API asked from inside a tab (the test process is in no lab namespace), and a native
// client (`generate --join`) in a lab host. Shared by the lab's end-to-end tests.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
import type { NetLab } from './netns.ts';
import type { LabBrowser } from './lab-browser.ts';
import { spawnMesh } from './mesh.ts';
import type { MeshProcess } from './mesh.ts';
import { parseJoinUrl } from '../../src/protocol/control.ts';

export interface Served {
  proc: MeshProcess;
  joinUrl: string;
  origin: string;
  roomId: string;
  secret: string;
  ca: string;
}

/** `gguf-mesh serve` of `model` in lab host `host`, bound to its address (TLS on by default there); its local CA lives in `cacheDir`/tls. */
export async function serveIn(lab: NetLab, host: string, model: string, cacheDir: string, extra: string[]): Promise<Served> {
  const h = lab.host(host);
  const proc = spawnMesh(['serve', '--host', h.ip, '--port', '0', '--ui', 'dist', '--model', model, ...extra], { prefix: lab.exec(host, []), env: { GGUF_MESH_CACHE: cacheDir } });
  const [, joinUrl] = await proc.waitFor(/join:\s+(\S+)/, 60_000);
  const link = parseJoinUrl(joinUrl!);
  return { proc, joinUrl: joinUrl!, origin: link.base, roomId: link.roomId, secret: link.secret!, ca: readFileSync(join(cacheDir, 'tls', 'ca.pem'), 'utf8') };
}

/** The room server's API, asked from inside a tab. */
export async function api(page: Page, s: Served, path: string): Promise<any> {
  return page.evaluate(
    async ({ url, secret }) => {
      const res = await fetch(url, { headers: { authorization: `Bearer ${secret}` } });
      return res.json();
    },
    { url: `${s.origin}${path}`, secret: s.secret },
  );
}

/** Polls the room (from a tab) until its route is ready; the route summary. */
export async function readyRoute(page: Page, s: Served, timeoutMs = 60_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const room = await api(page, s, `/v1/rooms/${s.roomId}`);
    if (room.route?.status === 'ready') return api(page, s, `/v1/routes/${room.route.id}`);
    if (Date.now() > deadline) throw new Error(`route not ready: ${JSON.stringify(room)}\n${s.proc.output()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Navigates, once more when Chromium reports the network changed under the navigation: a lab's
 * interfaces (their IPv6 link-local addresses finishing duplicate detection just after they came
 * up) change right after the lab is made, and Chromium aborts a load in flight then
 * (net::ERR_NETWORK_CHANGED) as it would on a laptop changing Wi-Fi. Nothing else is retried.
 */
export async function goto(page: Page, url: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await page.goto(url);
      return;
    } catch (e) {
      if (attempt >= 2 || !/ERR_NETWORK_CHANGED/.test((e as Error).message)) throw e;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

/** Opens the room link in a new tab of `b` (the real room page) and waits until it has joined. */
export async function openRoomPage(b: LabBrowser, url: string, label: string): Promise<Page> {
  const page = await (await b.browser.newContext()).newPage();
  page.on('console', (m) => m.type() === 'error' && console.log(`[${label}] ${m.text()}`));
  await goto(page, url);
  await page.waitForFunction(() => ['idle', 'ready'].includes(document.querySelector('.peer-view')?.getAttribute('data-status') ?? ''), null, { timeout: 45_000 });
  return page;
}

/** `generate --join` of `n` tokens in lab host `host` (a native client pinning the CA from the link): its JSON result. */
export async function generateIn(lab: NetLab, host: string, joinUrl: string, n: number): Promise<any> {
  const proc = spawnMesh(['generate', '--join', joinUrl, '--prompt', 'Once upon a time', '--n', String(n), '--json'], { prefix: lab.exec(host, []) });
  const code = await proc.exited;
  const line = proc.output().trim().split('\n').filter((l) => l.startsWith('{')).at(-1);
  if (code !== 0 || !line) throw new Error(`generate --join exited with ${code}:\n${proc.output()}`);
  return JSON.parse(line);
}
