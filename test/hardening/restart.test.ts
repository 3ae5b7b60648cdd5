// Nodes and tabs survive a restart of `serve`: a route of two cpu nodes and a WebGPU tab
// (headless Chromium, SwiftShader) on stories260K; serve is killed (SIGKILL, a crash) and
// started again on the same port with the same model and secret. The room keeps its id, so the
// old join link still works; the nodes and the tab rejoin with back-off, advertise the shards
// they hold verified, get the same layers back, load them without fetching, and the route
// generates the same greedy tokens as before the restart.
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import type { ViteDevServer } from 'vite';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RouteSessionClient } from '../../src/route/client.ts';
import { HttpLink } from '../../src/transport/http.ts';
import { closeBrowserTest, launchChromium, startPeerPage, waitForPeerState } from '../support/browser-route.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import type { MeshProcess, ServeInfo } from '../support/mesh.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from '../support/models.ts';

let vite: ViteDevServer;
let pageBase: string;
let browser: Browser;

beforeAll(async () => {
  ({ vite, pageBase } = await startPeerPage());
  browser = await launchChromium();
}, 120_000);

afterAll(() => closeBrowserTest(browser, vite, undefined));

const freePort = (): Promise<number> =>
  new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => resolve(port));
    });
  });

async function greedy(s: ServeInfo, routeId: number): Promise<number[]> {
  const c = await RouteSessionClient.open(new HttpLink(s.base, { authorization: `Bearer ${s.secret}` }), routeId, { contextLength: 64 });
  const out = [await c.prefill(STORIES_PROMPT_TOKENS, 4)];
  while (out.length < 12) out.push(await c.decode(out.at(-1)!));
  await c.close();
  return out;
}

const shards = (route: { stages: Array<{ shard: { start: number; end: number }; peer: { name?: string } }> }): string[] => route.stages.map((st) => `${st.peer.name}:${st.shard.start}-${st.shard.end}`);

describe('a serve restart', () => {
  it('keeps the room id and join link; nodes and a tab rejoin, get their layers back from their caches, and the route gives the same tokens', async () => {
    const model = await stories260K();
    const port = await freePort();
    const args = ['--port', String(port), '--secret', 'restart-test-secret', '--min-peers', '3', '--plan-delay', '500'];
    let s = await spawnServe(model, args);
    const nodes: MeshProcess[] = ['front', 'middle'].map((name) => spawnMesh(['node', '--join', s.joinUrl, '--name', name, '--cache-dir', mkdtempSync(join(tmpdir(), `restart-${name}-`))]));
    await Promise.all(nodes.map((n) => n.waitFor(/joined room/)));
    const page: Page = await (await browser.newContext()).newPage();
    await page.goto(`${pageBase}#${new URLSearchParams({ join: s.joinUrl, name: 'tab', memory: String(1 << 30) })}`);
    await waitForPeerState(page, (st) => st.status === 'ready', 'tab serving', 120_000);
    const before = await waitForRoute(s, 'ready', 120_000);
    expect(before.stages).toHaveLength(3);
    const tokens = await greedy(s, before.id);
    const oldRoom = s.roomId;
    const oldLink = s.joinUrl;

    await s.proc.kill('SIGKILL');
    await waitForPeerState(page, (st) => st.status === 'reconnecting', 'tab notices the server is gone', 30_000);
    s = await spawnServe(model, args);
    expect(s.roomId).toBe(oldRoom);
    expect(s.joinUrl).toBe(oldLink);
    const after = await waitForRoute(s, 'ready', 120_000);
    const tab = await waitForPeerState(page, (st) => st.status === 'ready', 'tab serving again', 120_000);

    // same layers on the same peers, loaded from what they kept verified
    expect(shards(after)).toEqual(shards(before));
    expect(tab.load?.fetchedBytes).toBe(0);
    for (const n of nodes) {
      expect(n.child.exitCode).toBeNull();
      expect(n.output()).toMatch(/control connection closed \(1006\); rejoining/);
      expect(n.output().split('joined room').at(-1)).toMatch(/holding embed|holding layer/);
    }
    expect((await getJson(`${s.base}/v1/rooms/${oldRoom}`, s.secret)).status).toBe(200);
    expect(await greedy(s, after.id)).toEqual(tokens);
  });
});
