// Browser peers on real devices, in headless Chromium (WebGPU on SwiftShader) against a real
// `gguf-mesh serve` on stories260K: a tab whose GPU device is lost (its GPU process crashed
// through the DevTools protocol) lowers its budget and tells the server, which re-plans once,
// never handing the tab the range it lost, and the route gives llama.cpp's tokens again; a
// serving tab whose page goes away hands its stage to a spare first; a tab's persisted shard
// cache survives a browser restart with zero model bytes fetched, and one evicted after the tab
// advertised it is fetched and verified again; a tab loads its shard from another tab.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium } from 'playwright-core';
import type { Browser, BrowserContext, CDPSession, Page } from 'playwright-core';
import { chromiumArgs } from '../vite.config.ts';
import { shardTensors } from '../src/gguf/verify.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { closeBrowserTest, launchChromium, peerState, startPeerPage, storiesOracle, waitForPeerState } from './support/browser-route.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { STORIES_PROMPT_TOKENS } from './support/models.ts';

const N = 12;
/** stories260K, its manifest, llama.cpp's greedy tokens; the peer page's server */
let oracle: Awaited<ReturnType<typeof storiesOracle>>;
let pages: Awaited<ReturnType<typeof startPeerPage>>;

beforeAll(async () => {
  oracle = await storiesOracle(N);
  pages = await startPeerPage();
});

afterAll(() => closeBrowserTest(undefined, pages?.vite, oracle?.llamaModel));

/** A serve process and a browser of its own for one describe block (a crashed GPU process loses every device in its browser). */
function servedRoom(serveArgs: string[]): { serve: ServeInfo; browser: Browser } {
  const room = {} as { serve: ServeInfo; browser: Browser };
  beforeAll(async () => {
    room.serve = await spawnServe(oracle.modelPath, serveArgs);
    room.browser = await launchChromium();
  });
  afterAll(async () => {
    if (process.env.DUMP) console.log(room.serve?.proc.output());
    await room.browser?.close();
    await room.serve?.proc.kill();
  });
  return room;
}

async function openTab(browser: Browser, serve: ServeInfo, name: string, extra: Record<string, string> = {}): Promise<{ context: BrowserContext; page: Page }> {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on('console', (m) => m.type() === 'error' && console.log(`[${name}] ${m.text()}`));
  await page.goto(`${pages.pageBase}#${new URLSearchParams({ join: serve.joinUrl, name, memory: String(1 << 30), ...extra })}`);
  await waitForPeerState(page, (s) => s.status === 'idle' || s.status === 'ready', `${name} joined`);
  return { context, page };
}

async function greedyOverHttp(serve: ServeInfo, routeId: number): Promise<number[]> {
  const c = await RouteSessionClient.open(new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` }), routeId, { contextLength: 64 });
  const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 2)];
  while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
  await c.close();
  return tokens;
}

const bytesOf = (shard: { start: number; end: number }): number => shardTensors(oracle.manifest, shard.start, shard.end).reduce((s, t) => s + t.byte_length, 0);

describe('a tab whose GPU device is lost while serving', () => {
  const room = servedRoom(['--min-peers', '2', '--repair-timeout', '1500']);

  it('lowers its budget, and the server re-plans once without handing the lost range back; tokens equal llama.cpp\'s', async () => {
    const { serve, browser } = room;
    const tab = await openTab(browser, serve, 'g0');
    const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', 'native']);
    await node.waitFor(/joined room/);
    const first = await waitForRoute(serve, 'ready', 60_000);
    const lostStage = first.stages.find((s: any) => s.peerId.startsWith('g0-'));
    expect(lostStage).toBeDefined();
    expect(await greedyOverHttp(serve, first.id)).toEqual(oracle.expected);

    // a real device loss: the browser's GPU process dies (the DevTools protocol's Browser.crashGpuProcess)
    const cdp = await browser.newBrowserCDPSession();
    await cdp.send('Browser.crashGpuProcess');
    const failed = await waitForPeerState(tab.page, (s) => s.error?.code === 'WEBGPU_DEVICE_LOST', 'device loss seen', 20_000);
    expect(failed.capabilities!.memoryBytes).toBeLessThan(bytesOf(lostStage.shard));
    expect(failed.capabilities!.memoryBytes).toBeLessThanOrEqual(2 ** 29);

    // repair finds no spare within 1.5 s, the route degrades, and the room plans anew, once
    let second: any;
    const deadline = Date.now() + 60_000;
    for (;;) {
      const { body } = await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret);
      if (body.route && body.route.id !== first.id && body.route.status === 'ready') {
        second = (await getJson(`${serve.base}/v1/routes/${body.route.id}`, serve.secret)).body;
        break;
      }
      if (Date.now() > deadline) throw new Error(`no new ready route: ${JSON.stringify(body)}\n${serve.proc.output()}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    const again = second.stages.find((s: any) => s.peerId === lostStage.peerId);
    if (again) {
      expect(again.shard).not.toEqual(lostStage.shard);
      expect(bytesOf(again.shard)).toBeLessThan(bytesOf(lostStage.shard));
    }
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    const g0 = peers.find((p: any) => p.id === lostStage.peerId);
    expect(g0.memoryBytes).toBe(failed.capabilities!.memoryBytes);
    expect(g0.plannedMemoryBytes).toBeLessThan(bytesOf(lostStage.shard));
    expect(await greedyOverHttp(serve, second.id)).toEqual(oracle.expected);
    // no plan–fail loop: one more route, and it stays
    await new Promise((r) => setTimeout(r, 2000));
    const { body: now } = await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret);
    expect(now.route.id).toBe(second.id);
    expect(second.id).toBe(first.id + 1);
    console.log(`[memory] g0 served layers ${lostStage.shard.start}-${lostStage.shard.end} (${bytesOf(lostStage.shard)} bytes); after the device loss it offers ${g0.memoryBytes}, plans give it ${g0.plannedMemoryBytes}; new route: ${second.stages.map((s: any) => `${s.peerId.split('-')[0]} ${s.shard.start}-${s.shard.end}`).join(', ')}`);
    await tab.context.close();
  });
});

/** Recent events of a room or session (`path`: the stream replays them to a new subscriber), read for `ms`. */
async function eventsOf(serve: ServeInfo, path: string, ms = 800): Promise<any[]> {
  const ctl = new AbortController();
  const res = await fetch(`${serve.base}${path}/events`, { headers: { authorization: `Bearer ${serve.secret}` }, signal: ctl.signal });
  const reader = res.body!.getReader();
  let text = '';
  const stop = setTimeout(() => ctl.abort(), ms);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
  } catch {
    // aborted: what came so far is the replay
  }
  clearTimeout(stop);
  return [...text.matchAll(/^data: (.*)$/gm)].map((m) => JSON.parse(m[1]!));
}

async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not reached in ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('a serving tab whose page goes away', () => {
  const room = servedRoom(['--min-peers', '2']);

  it('holds a wake lock while serving; when its page unloads (hidden, then gone) it hands its stage to the spare and the client gets the same tokens with no error', async () => {
    const { serve, browser } = room;
    const s0 = await openTab(browser, serve, 's0', { suspend: 'leave' });
    const s1 = await openTab(browser, serve, 's1', { suspend: 'leave' });
    const route = await waitForRoute(serve, 'ready', 60_000);
    expect(route.stages).toHaveLength(2);
    for (const t of [s0, s1]) await until('wake lock held', () => t.page.evaluate(() => window.__suspension?.state.wakeLock === 'held'), 10_000);
    const spare = await openTab(browser, serve, 'spare', { suspend: 'leave' });
    await until('warm spare', async () => (await getJson(`${serve.base}/v1/routes/${route.id}`, serve.secret)).body.spares.some((s: any) => s.status === 'ready'));
    // a spare serves no stage yet: it holds no wake lock
    expect(await spare.page.evaluate(() => window.__suspension!.state.wakeLock)).toBe('released');

    const victim = route.stages[1].peerId.startsWith('s1-') ? s1 : s0;
    const victimId = (await peerState(victim.page))!.peerId;
    const c = await RouteSessionClient.open(new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` }), route.id, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 2)];
    while (tokens.length < N / 2) tokens.push(await c.decode(tokens.at(-1)!));
    // the page unloads for real: visibilitychange (hidden) starts the hand-over, then its socket closes
    await victim.page.goto('about:blank');
    while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
    const sessionEvents = await eventsOf(serve, `/v1/sessions/${c.sessionId}`);
    await c.close();
    expect(tokens).toEqual(oracle.expected);

    const events = await eventsOf(serve, `/v1/rooms/${serve.roomId}`);
    const lost = events.filter((e) => e.type === 'stage_lost' && e.peerId === victimId);
    // an unloading document turns hidden first: the tab said leave before its socket closed
    expect(lost[0]?.cause).toMatch(/gracefully/);
    expect(sessionEvents.some((e) => e.type === 'error')).toBe(false);
    const repaired = sessionEvents.find((e) => e.type === 'route_repaired');
    expect(repaired).toBeDefined();
    const now = await waitForRoute(serve, 'ready', 30_000);
    expect(now.stages.map((s: any) => s.peerId)).not.toContain(victimId);
    console.log(`[suspend] ${victimId}'s page unloaded; route ${now.id}: ${now.stages.map((s: any) => s.peerId).join(' → ')}; repair replayed ${repaired.tokensReplayed} tokens in ${repaired.repairMs} ms`);
  });
});

describe('a persisted shard cache', () => {
  let serve: ServeInfo;
  const profile = mkdtempSync(join(tmpdir(), 'gguf-mesh-profile-'));

  beforeAll(async () => {
    // a plan delay long enough to clear a joined tab's storage before its assignment comes
    serve = await spawnServe(oracle.modelPath, ['--min-peers', '1', '--plan-delay', '2000']);
  });
  afterAll(async () => {
    await serve?.proc.kill();
    rmSync(profile, { recursive: true, force: true });
  });

  /** One browser run on the same profile: the tab joins (`joined` runs then), serves the whole model, and the browser closes. */
  async function run(name: string, joined?: (cdp: CDPSession) => Promise<void>): Promise<{ state: any; fetched: number | undefined }> {
    const context = await chromium.launchPersistentContext(profile, { executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium', args: chromiumArgs });
    try {
      // the permission a browser grants an installed or much-used site: persist() then answers true (a persistent context has no browser handle: a page session)
      const cdp = await context.browser()?.newBrowserCDPSession() ?? await context.newCDPSession(context.pages()[0] ?? await context.newPage());
      await cdp.send('Browser.grantPermissions', { permissions: ['durableStorage'], origin: new URL(pages.pageBase).origin });
      const page = context.pages()[0] ?? await context.newPage();
      await page.goto(`${pages.pageBase}#${new URLSearchParams({ join: serve.joinUrl, name, memory: String(1 << 30) })}`);
      await waitForPeerState(page, (s) => s.status === 'idle', `${name} joined`, 30_000);
      if (joined) await joined(await context.newCDPSession(page));
      const state = await waitForPeerState(page, (s) => s.status === 'ready', `${name} serving`, 60_000);
      const fetches = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
      return { state, fetched: fetches[state.peerId!]?.bytes };
    } finally {
      await context.close();
    }
  }

  it('is asked to persist, shows quota and usage, and survives a browser restart: zero bytes fetched', async () => {
    const first = await run('p0');
    expect(first.state.storage.persisted).toBe(true);
    expect(first.state.storage.quotaBytes).toBeGreaterThan(0);
    expect(first.state.storage.usageBytes).toBeGreaterThanOrEqual(first.state.load.totalBytes);
    expect(first.fetched).toBeGreaterThanOrEqual(first.state.load.totalBytes);
    await waitForRoute(serve, 'degraded', 30_000).catch(() => undefined); // the tab left with the browser
    const second = await run('p1');
    expect(second.state.heldUnits.length).toBeGreaterThan(0);
    expect(second.state.load.fetchedBytes).toBe(0);
    expect(second.state.load.cachedBytes).toBe(second.state.load.totalBytes);
    expect(second.fetched ?? 0).toBe(0);
    expect(second.state.storage.evictedUnits).toEqual([]);
    console.log(`[storage] first run fetched ${first.fetched} bytes; after the restart 0 fetched, ${second.state.load.cachedBytes} from the cache; usage ${second.state.storage.usageBytes} of ${second.state.storage.quotaBytes}`);
    await waitForRoute(serve, 'degraded', 30_000).catch(() => undefined);

    // evicted after the tab advertised its units: the browser clears the origin's IndexedDB (as under storage pressure)
    const third = await run('p2', (cdp) => cdp.send('Storage.clearDataForOrigin', { origin: new URL(pages.pageBase).origin, storageTypes: 'indexeddb' }).then(() => undefined));
    expect(third.state.storage.evictedUnits.sort()).toEqual([...third.state.load.units].sort());
    expect(third.state.load.cachedBytes).toBe(0);
    expect(third.fetched).toBeGreaterThanOrEqual(third.state.load.totalBytes); // fetched and verified again, nothing missing served
  });
});

describe('shards from other peers', () => {
  const room = servedRoom(['--min-peers', '2']);

  it('a third tab, the model hosting blocked for it, loads its shard from a serving tab over WebRTC, verified, and serves it', async () => {
    const { serve, browser } = room;
    const x0 = await openTab(browser, serve, 'x0');
    const x1 = await openTab(browser, serve, 'x1');
    const route = await waitForRoute(serve, 'ready', 60_000);
    expect(route.stages).toHaveLength(2);
    // the newcomer's browser context refuses every request for the model's bytes: only peers can give them
    const context = await browser.newContext();
    let blocked = 0;
    await context.route(/\/models\/[^/]+\.gguf/, (r) => {
      blocked++;
      return r.abort('blockedbyclient');
    });
    const page = await context.newPage();
    page.on('console', (m) => m.type() === 'error' && console.log(`[x2] ${m.text()}`));
    await page.goto(`${pages.pageBase}#${new URLSearchParams({ join: serve.joinUrl, name: 'x2', memory: String(1 << 30) })}`);
    const spare = await waitForPeerState(page, (s) => s.standby !== null, 'x2 holds its standby shard', 60_000);
    const sourceStage = route.stages.find((s: any) => s.shard.start === spare.standby!.shard.start && s.shard.end === spare.standby!.shard.end);
    const source = sourceStage.peerId.startsWith('x0-') ? x0 : x1;
    const load = spare.standby!.load as any;
    expect(load.fetchedBytes).toBe(0);
    expect(load.peerBytes).toEqual({ [sourceStage.peerId]: load.totalBytes });
    expect(blocked).toBe(0); // it never needed the server
    const fetches = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
    expect(fetches[spare.peerId!]).toBeUndefined();
    expect((await peerState(source.page))!.served.servedBytes).toBe(load.totalBytes);

    // the bytes it got are the model's: its stage computes llama.cpp's tokens once the source leaves
    await source.context.close();
    // status and stages from one answer: the room's status read apart from them may be older
    const repaired = await until('route repaired onto x2', async () => {
      const r = (await getJson(`${serve.base}/v1/routes/${route.id}`, serve.secret)).body;
      return r.status === 'ready' && r.stages.some((s: any) => s.peerId === spare.peerId) ? r : null;
    }, 40_000);
    expect(await greedyOverHttp(serve, repaired.id)).toEqual(oracle.expected);
    console.log(`[p2p] x2 loaded layers ${spare.standby!.shard.start}-${spare.standby!.shard.end} (${load.totalBytes} bytes) from ${sourceStage.peerId} over WebRTC, 0 from the server (whose hosting was blocked for it); server bytes sent in all: ${Object.values(fetches).reduce((a: number, c: any) => a + c.bytes, 0)} for a ${oracle.manifest.tensor_data_bytes}-byte model`);
    await context.close();
  });
});
