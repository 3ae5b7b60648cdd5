// `npm start` as a user meets it: `gguf-mesh serve` with no --ui serves the production build
// (built on install, rebuilt on start when a source is newer) and nothing else of the checkout.
// Headless Chromium opens the landing page and a join link: no console error or warning, no
// page error, and every script is a file of the built bundle. `--ui dev` stays for development:
// vite from the sources, on this machine only, its HMR socket on 127.0.0.1.
import { readdirSync, readFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, Page } from 'playwright-core';
import { runCli, REPO_ROOT } from './support/cli.ts';
import { killAll, spawnMesh } from './support/mesh.ts';
import { launchChromium, serveDefault, watchedPage } from './fixtures/ui/harness.ts';
import type { Served } from './fixtures/ui/harness.ts';

let served: Served;
let browser: Browser;

beforeAll(async () => {
  // no ensureBuilt(): serve itself builds what is missing or stale, as on a user's first start
  served = await serveDefault();
  browser = await launchChromium();
}, 240_000);

afterAll(async () => {
  await browser?.close();
  await killAll();
});

/** The built app's scripts (/assets/…js) and the one index.html loads first. */
function builtScripts(): { all: Set<string>; entry: string } {
  const all = new Set(readdirSync(join(REPO_ROOT, 'dist', 'app', 'assets')).filter((f) => f.endsWith('.js')).map((f) => `/assets/${f}`));
  const entry = /<script type="module"[^>]*src="([^"]+)"/.exec(readFileSync(join(REPO_ROOT, 'dist', 'app', 'index.html'), 'utf8'))![1]!;
  return { all, entry };
}

/** Every request the page (and its workers) makes, by path, and the script paths among them. */
function recordRequests(page: Page): { paths: string[]; scripts: string[] } {
  const seen = { paths: [] as string[], scripts: [] as string[] };
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol === 'data:' || u.protocol === 'blob:') return;
    seen.paths.push(u.pathname);
    if (r.resourceType() === 'script') seen.scripts.push(u.pathname);
  });
  return seen;
}

/** Paths the production page may ask for: its HTML, the built assets, the app/API endpoints, and the trust card's /tls/ca.json. */
const ALLOWED = /^(\/|\/room\/[^/]+|\/assets\/[^/]+|\/app\/rooms|\/v1\/.+|\/models\/.+|\/tls\/ca\.json)$/;

describe('npm start: the production build', () => {
  it('says it serves the build', () => {
    expect(served.proc.output()).toMatch(/page:\s+\S+\s+\(web app: dist\)/);
  });

  it('serves nothing of the checkout outside the built app, the component bundle and the hosted models', async () => {
    const outside = ['/package.json', '/vite.config.ts', '/src/ui/main.ts', '/workers/webgpu-stage.worker.ts', '/node_modules/vite/package.json',
      '/dist/app/index.html', '/.git/HEAD', '/@vite/client', '/@fs/etc/passwd', '/.cache/', '/test/e2e-ui-production.test.ts', '/components/../package.json'];
    for (const path of outside) {
      const res = await fetch(`${served.base}${path}`);
      expect(res.status, path).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code, path).toBe('NOT_FOUND');
    }
    expect((await fetch(`${served.base}/components/gguf-mesh.js`, { method: 'HEAD' })).status).toBe(200);
  });

  it('the landing page and a join link load with no console error or warning, from the built scripts only', async () => {
    const { all, entry } = builtScripts();
    const problems: string[] = [];

    const landing = await watchedPage(browser, problems, 'landing');
    const landingRequests = recordRequests(landing.page);
    await landing.page.goto(served.pageUrl);
    await landing.page.getByText('gguf-mesh-default', { exact: true }).waitFor();

    const joined = await watchedPage(browser, problems, 'join link');
    const joinRequests = recordRequests(joined.page);
    await joined.page.goto(served.joinUrl);
    await joined.page.getByText('Serving its layers').waitFor({ timeout: 90_000 });
    await landing.page.waitForLoadState('networkidle');

    for (const seen of [landingRequests, joinRequests]) {
      expect(seen.paths.filter((p) => !ALLOWED.test(p))).toEqual([]);
      expect(seen.scripts).toContain(entry);
      expect(seen.scripts.filter((s) => !all.has(s))).toEqual([]);
    }
    // the stage's worker is the built one too
    expect(joinRequests.scripts.some((s) => /\/assets\/webgpu-stage\.worker-[^/]+\.js$/.test(s))).toBe(true);
    console.info(`scripts loaded: landing ${new Set(landingRequests.scripts).size}, join link ${new Set(joinRequests.scripts).size} (built bundle: ${all.size})`);
    expect(problems).toEqual([]);
    await landing.context.close();
    await joined.context.close();
  }, 180_000);
});

describe('serve --ui dev', () => {
  it('refuses to serve the source tree beyond this machine', async () => {
    const r = await runCli(['serve', '--port', '0', '--ui', 'dev', '--host', '0.0.0.0']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--ui dev serves the whole source tree/);
  });

  it('serves the page from the sources with HMR on 127.0.0.1 only', async () => {
    const proc = spawnMesh(['serve', '--port', '0', '--ui', 'dev']);
    const [, pageUrl] = await proc.waitFor(/page:\s+(\S+)\s+\(web app: dev\)/, 120_000);
    const problems: string[] = [];
    const { page, context } = await watchedPage(browser, problems, 'dev');
    const requests = recordRequests(page);
    const hmr = new Promise<string>((resolve) => page.on('websocket', (ws) => resolve(ws.url())));
    await page.goto(pageUrl!);
    await page.getByText('gguf-mesh-default', { exact: true }).waitFor({ timeout: 60_000 });
    const [, hmrPort] = await proc.waitFor(/HMR on ws:\/\/127\.0\.0\.1:(\d+)/);
    expect(await hmr).toMatch(new RegExp(`^ws://127\\.0\\.0\\.1:${hmrPort}/`));
    expect(requests.scripts).toContain('/src/ui/main.ts');
    console.info(`dev page scripts: ${new Set(requests.scripts).size}`);
    expect(problems).toEqual([]);
    // the HMR socket is not reachable on this machine's other addresses
    const lan = Object.values(networkInterfaces()).flat().find((a) => a && a.family === 'IPv4' && !a.internal);
    if (lan) {
      const reached = await new Promise<boolean>((resolve) => {
        const s = connect(Number(hmrPort), lan.address, () => (s.destroy(), resolve(true)));
        s.on('error', () => resolve(false));
      });
      expect(reached, `HMR port ${hmrPort} on ${lan.address}`).toBe(false);
    }
    await context.close();
    await proc.kill('SIGTERM');
  }, 180_000);
});
