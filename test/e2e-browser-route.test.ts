// Browser peers end to end: a real `gguf-mesh serve` on stories260K, a vite dev server for the
// test peer page (test/fixtures/peer-page), and headless Chromium (WebGPU on SwiftShader)
// driven by playwright-core. Three browser contexts open the room link; the route forms over
// them; greedy tokens through the server's binary HTTP API equal llama.cpp's; each tab fetched
// only its shard; hidden states crossed the WebRTC data channels; a reload loads from the
// shard cache with zero model bytes fetched; blocked direct connections fall back to the relay;
// two tabs and a native cpu node serve one route.
import { join } from 'node:path';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { tmpdir } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium } from 'playwright-core';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { createServer } from 'vite';
import type { ViteDevServer } from 'vite';
import type { LlamaModel } from 'node-llama-cpp';
import OpenAI from 'openai';
import { chromiumArgs } from '../vite.config.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { HttpLink } from '../src/transport/http.ts';
import { manifestJson } from '../src/gguf/manifest.ts';
import type { Manifest } from '../src/gguf/verify.ts';
import { shardTensors } from '../src/gguf/verify.ts';
import { closeBrowserTest, expectDirectPair, launchChromium, peerState, startPeerPage, storiesOracle, waitForPeerState } from './support/browser-route.ts';
import { getJson, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { STORIES_PROMPT_TOKENS } from './support/models.ts';
import { streamCompletion } from './support/sse.ts';

const N = 16;
let modelPath: string;
let manifest: Manifest;
let expected: number[];
let llamaModel: LlamaModel;
let vite: ViteDevServer;
let pageBase: string;
let browser: Browser;

beforeAll(async () => {
  ({ modelPath, manifest, llamaModel, expected } = await storiesOracle(N));
  ({ vite, pageBase } = await startPeerPage());
  browser = await launchChromium();
});

afterAll(() => closeBrowserTest(browser, vite, llamaModel));

interface Tab {
  context: BrowserContext;
  page: Page;
}

function pageUrl(serve: ServeInfo, name: string, extra: Record<string, string> = {}): string {
  return `${pageBase}#${new URLSearchParams({ join: serve.joinUrl, name, memory: String(1 << 30), ...extra })}`;
}

async function openTab(serve: ServeInfo, name: string, extra: Record<string, string> = {}, before?: (page: Page) => Promise<void>): Promise<Tab> {
  const context = await browser.newContext();
  const page = await context.newPage();
  await before?.(page);
  page.on('console', (m) => m.type() === 'error' && console.log(`[${name}] ${m.text()}`));
  await page.goto(pageUrl(serve, name, extra));
  await waitForPeerState(page, (s) => s.status === 'idle' || s.status === 'ready', `${name} joined`);
  return { context, page };
}

/** Greedy generation through the server's binary HTTP session API. */
async function generateOverHttp(serve: ServeInfo, routeId: number, label: string): Promise<number[]> {
  const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
  const c = await RouteSessionClient.open(link, routeId, { contextLength: 64 });
  const t0 = performance.now();
  const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 2)];
  const t1 = performance.now();
  while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
  const t2 = performance.now();
  // measured numbers for the record (SwiftShader WebGPU, loopback; not asserted)
  console.log(`[timing] ${label}: prefill ${STORIES_PROMPT_TOKENS.length} tokens in 3 chunks ${(t1 - t0).toFixed(1)} ms, decode ${((t2 - t1) / (N - 1)).toFixed(1)} ms/token over ${N - 1} steps`);
  const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
  for (const st of info.stages) expect(st.processedTokens).toEqual(new Array(st.shard.end - st.shard.start).fill(STORIES_PROMPT_TOKENS.length + N - 1));
  await c.close();
  const closed = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
  for (const st of closed.stages) expect(st.kvBytes).toBe(0); // every stage freed the session's KV cache
  return tokens;
}

function shardBytesOf(shard: { start: number; end: number }): number {
  return shardTensors(manifest, shard.start, shard.end).reduce((s, t) => s + t.byte_length, 0);
}

describe('three browser tabs serve stories260K', () => {
  let serve: ServeInfo;
  let tabs: Tab[] = [];
  let firstRoute: any;

  beforeAll(async () => {
    serve = await spawnServe(modelPath, ['--min-peers', '3']);
    for (const name of ['t0', 't1', 't2']) tabs.push(await openTab(serve, name));
    firstRoute = await waitForRoute(serve, 'ready', 60_000);
  });
  afterAll(async () => {
    for (const t of tabs) await t.context.close();
    await serve?.proc.kill();
  });

  it('forms a 3-stage all-browser route whose greedy tokens equal llama.cpp\'s', async () => {
    expect(firstRoute.stages).toHaveLength(3);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body;
    expect(peers.peers.every((p: any) => p.backend === 'webgpu')).toBe(true);
    expect(await generateOverHttp(serve, firstRoute.id, 'webrtc x3 (first load)')).toEqual(expected);
  });

  it('the OpenAI-compatible completions API on the browser route gives llama.cpp\'s greedy text, streamed and not', async () => {
    const tokenizer = Tokenizer.fromMetadata((await readHeader(modelPath)).metadata);
    const want = tokenizer.decode(expected);
    const openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
    const full = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: N, temperature: 0 });
    expect(full.choices[0]!.text).toBe(want);
    const stream = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: N, temperature: 0, stream: true });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.text ?? '';
    expect(text).toBe(want);
  });

  it('each tab fetched only its shard\'s byte ranges (≤ 1.02 × shard bytes)', async () => {
    const fetches = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
    for (const st of firstRoute.stages) {
      const log = fetches[st.peerId];
      expect(log, `no fetches by ${st.peerId}`).toBeDefined();
      const shardBytes = shardBytesOf(st.shard);
      console.log(`[fetch] stage ${st.stage} layers ${st.shard.start}-${st.shard.end}: ${log.bytes} bytes in ${log.requests} requests for ${shardBytes} shard bytes (×${(log.bytes / shardBytes).toFixed(4)}), loaded in ${Math.round(st.loadMs)} ms`);
      expect(log.bytes).toBeGreaterThanOrEqual(shardBytes);
      expect(log.bytes).toBeLessThanOrEqual(1.02 * shardBytes);
      const tensors = shardTensors(manifest, st.shard.start, st.shard.end);
      for (const [a, b] of log.ranges as Array<[number, number]>) {
        // every byte fetched lies inside some span of this shard's tensors (gaps ≤ coalescing)
        expect(tensors.some((t) => a >= t.offset - 4096 && a <= t.offset + t.byte_length)).toBe(true);
        expect(b).toBeLessThan(manifest.artifact.size);
      }
    }
  });

  it('hidden states crossed the data channels, not the server', async () => {
    const states = await Promise.all(tabs.map((t) => peerState(t.page)));
    const byStage = [...states].sort((a, b) => a!.stage! - b!.stage!);
    expect(byStage.map((s) => s!.hop)).toEqual(['webrtc', 'webrtc', 'none']);
    for (const s of byStage.slice(0, 2)) {
      // prefill (3 chunks) + decode steps: one Hidden request per step at least
      expect(s!.downstreamChannel!.sentByType.Hidden).toBeGreaterThanOrEqual(N + 1);
      expect(s!.downstreamChannel!.largestMessage).toBeLessThanOrEqual(256 * 1024);
    }
    for (const s of byStage.slice(1)) {
      const received = Object.values(s!.upstreamChannels).reduce((a, c) => a + (c.receivedByType.Hidden ?? 0), 0);
      expect(received).toBeGreaterThanOrEqual(N + 1);
    }
    const relayed = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.relayed;
    expect(relayed).toEqual({});
    // the same counts reach the server's route summary as stage telemetry
    let summary: any;
    for (let i = 0; i < 30; i++) {
      summary = (await getJson(`${serve.base}/v1/routes/${firstRoute.id}`, serve.secret)).body;
      if (summary.stages[0].telemetry?.downstreamChannel?.sentByType?.Hidden >= N + 1) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(summary.stages.map((s: any) => s.telemetry?.hop)).toEqual(['webrtc', 'webrtc', 'none']);
    expect(summary.stages[0].telemetry.downstreamChannel.sentByType.Hidden).toBeGreaterThanOrEqual(N + 1);
  });

  it('after a reload the route forms again from the shard cache: zero model bytes fetched, same tokens', async () => {
    const before = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
    const bytesBefore = Object.values(before).reduce((a: number, c: any) => a + c.bytes, 0);
    for (const t of tabs) await t.page.reload();
    for (const t of tabs) await waitForPeerState(t.page, (s) => s.status === 'ready', 'reloaded tab ready', 60_000);
    const route = await waitForRoute(serve, 'ready', 60_000);
    // each reloaded tab took its stage back (the route repaired, or planned anew from the cached units)
    const rejoined = (await Promise.all(tabs.map((t) => peerState(t.page)))).map((s) => s!.peerId);
    expect(route.stages.map((s: any) => s.peerId).sort()).toEqual([...rejoined].sort());
    expect(rejoined).not.toContain(firstRoute.stages[0].peerId);
    const after = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
    const bytesAfter = Object.values(after).reduce((a: number, c: any) => a + c.bytes, 0);
    expect(bytesAfter).toBe(bytesBefore);
    // the reloaded tabs advertised the units they hold verified
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    for (const p of peers) {
      expect(p.artifact).toBe(manifest.artifact.sha256);
      const st = route.stages.find((x: any) => x.peerId === p.id);
      expect(p.units.length).toBeGreaterThan(0);
      expect(p.units).toContain(`layer.${st.shard.start}`);
    }
    for (const t of tabs) {
      const s = (await peerState(t.page))!;
      expect(s.load!.fetchedBytes).toBe(0);
      expect(s.load!.cachedBytes).toBe(s.load!.totalBytes);
      expect(s.load!.cachedUnits.length).toBe(s.load!.units.length);
    }
    const tokens = await generateOverHttp(serve, route.id, 'webrtc x3 (after reload, cached)').catch(async (e: Error) => {
      const logs = await Promise.all(tabs.map((t) => t.page.evaluate(() => window.__peerLog.join('\n'))));
      throw new Error(`${e.message}\n${serve.proc.output().split('\n').filter((l) => !/session [0-9a-f]+: /.test(l)).slice(-40).join('\n')}\n${logs.join('\n----\n')}`);
    });
    expect(tokens).toEqual(expected);
  });

  it('when the last stage\'s tab closes, a new tab takes its place in the same route; the first two reconnect on a fresh channel', async () => {
    const states = await Promise.all(tabs.map((t) => peerState(t.page)));
    const last = tabs[states.findIndex((s) => s!.stage === 2)]!;
    const firstTwo = states.filter((s) => s!.stage !== 2).map((s) => s!.peerId);
    const before = await waitForRoute(serve, 'ready', 30_000);
    await last.context.close();
    tabs = tabs.filter((t) => t !== last);
    // no spare yet: the route waits for one (repairing), and the next tab to join is it
    await waitForRoute(serve, 'repairing', 30_000);
    tabs.push(await openTab(serve, 't3'));
    const route = await waitForRoute(serve, 'ready', 60_000);
    expect(route.id).toBe(before.id);
    expect(route.stages.slice(0, 2).map((s: any) => s.peerId)).toEqual(firstTwo);
    expect(route.stages.map((s: any) => s.telemetry?.hop)).toEqual(['webrtc', 'webrtc', 'none']);
    expect(await generateOverHttp(serve, route.id, 'webrtc x3 (replaced last tab)')).toEqual(expected);
  });

  it('a 4th tab is a warm spare; the middle tab closed mid-reply: the streamed text equals the uninterrupted run, no error', async () => {
    tabs.push(await openTab(serve, 't4'));
    const spare = await waitForPeerState(tabs.at(-1)!.page, (s) => s.standby !== null, 't4 holds its standby shard');
    const withSpare = await waitForRoute(serve, 'ready', 30_000);
    expect(withSpare.spares.map((x: any) => x.peerId)).toContain(spare.peerId);
    const body = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 48, temperature: 0 };
    const reference = await streamCompletion(serve.base, serve.secret, body);
    expect(reference.errors).toEqual([]);
    // the tab serving the spare's stage leaves mid-reply (its tab closes)
    const states = await Promise.all(tabs.map((t) => peerState(t.page)));
    const held = spare.standby!.shard;
    const victim = tabs[states.findIndex((s) => s!.status === 'ready' && s!.shard?.start === held.start && s!.shard?.end === held.end)];
    expect(victim, JSON.stringify(states)).toBeDefined();
    let closing: Promise<void> | null = null;
    const out = await streamCompletion(serve.base, serve.secret, body, (n) => {
      if (n === 8) closing = victim!.context.close();
    });
    await closing;
    tabs = tabs.filter((t) => t !== victim);
    expect(out.errors, `${JSON.stringify(out.errors)}\n${serve.proc.output().split('\n').filter((l) => !/session [0-9a-f]+: (idle|decoding|prefilling)/.test(l)).slice(-40).join('\n')}`).toEqual([]);
    expect(out.text).toBe(reference.text);
    const repaired = out.events.find((e) => e.type === 'route_repaired');
    expect(repaired, JSON.stringify(out.events.map((e) => e.type))).toBeDefined();
    expect(repaired.peers).toEqual([spare.peerId]);
  });
});

describe('blocked direct connections relay through the server (slices cached in OPFS)', () => {
  let serve: ServeInfo;
  const tabs: Tab[] = [];

  beforeAll(async () => {
    serve = await spawnServe(modelPath, ['--min-peers', '3']);
    // iceTransportPolicy 'relay' with no TURN server: no candidate pair can form, as on a blocking network
    for (const name of ['r0', 'r1', 'r2']) tabs.push(await openTab(serve, name, { ice: 'relay', rtcTimeoutMs: '1500', storage: 'opfs' }));
  });
  afterAll(async () => {
    for (const t of tabs) await t.context.close();
    await serve?.proc.kill();
  });

  it('forms the route over relayed hops, says so in telemetry, and gives the same tokens', async () => {
    const route = await waitForRoute(serve, 'ready', 60_000);
    expect(await generateOverHttp(serve, route.id, 'relay x2 (blocked direct)')).toEqual(expected);
    const summary = (await getJson(`${serve.base}/v1/routes/${route.id}`, serve.secret)).body;
    expect(summary.stages.slice(0, 2).map((s: any) => s.telemetry?.hop)).toEqual(['relay', 'relay']);
    const relayed = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.relayed;
    const hops = [`${route.stages[0].peerId}->${route.stages[1].peerId}`, `${route.stages[1].peerId}->${route.stages[2].peerId}`];
    for (const h of hops) expect(relayed[h]?.frames).toBeGreaterThanOrEqual(N + 1);
    const states = await Promise.all(tabs.map((t) => peerState(t.page)));
    for (const s of states) expect(s!.downstreamChannel).toBeNull();
  });

  it('reloads from the OPFS cache with zero bytes fetched and relays again', async () => {
    for (const t of tabs) await t.page.reload();
    for (const t of tabs) await waitForPeerState(t.page, (s) => s.status === 'ready', 'reloaded tab ready', 60_000);
    const route = await waitForRoute(serve, 'ready', 60_000);
    for (const t of tabs) {
      const s = (await peerState(t.page))!;
      expect(s.load!.fetchedBytes).toBe(0);
      expect(s.load!.cachedUnits.length).toBe(s.load!.units.length);
    }
    expect(await generateOverHttp(serve, route.id, 'relay x2 (after reload, OPFS)')).toEqual(expected);
  });
});

describe('a mixed route: two browser tabs and a native cpu node', () => {
  let serve: ServeInfo;
  const tabs: Tab[] = [];

  beforeAll(async () => {
    serve = await spawnServe(modelPath, ['--min-peers', '3']);
    // m0's origin gets a tiny storage quota (DevTools protocol): its shard cache must fail loudly, not the load
    tabs.push(await openTab(serve, 'm0', {}, async (page) => {
      const cdp = await page.context().newCDPSession(page);
      await cdp.send('Storage.overrideQuotaForOrigin', { origin: new URL(pageBase).origin, quotaSize: 64 * 1024 });
    }));
    tabs.push(await openTab(serve, 'm1'));
    const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', 'native']);
    await node.waitFor(/joined room/);
  });
  afterAll(async () => {
    for (const t of tabs) await t.context.close();
    await serve?.proc.kill();
  });

  it('serves one model with tokens identical to llama.cpp\'s', async () => {
    const route = await waitForRoute(serve, 'ready', 60_000);
    expect(route.stages).toHaveLength(3);
    expect(route.stages[2].peerId.startsWith('native-')).toBe(true);
    expect(await generateOverHttp(serve, route.id, 'mixed: 2 tabs + cpu node')).toEqual(expected);
    const byStage = (await Promise.all(tabs.map((t) => peerState(t.page)))).sort((a, b) => a!.stage! - b!.stage!);
    expect(byStage.map((s) => s!.hop)).toEqual(['webrtc', 'webrtc']); // browser → native over a data channel too (native-rtc.ts)
    expectDirectPair(byStage[1]!.candidatePair);
    // stages report telemetry every few seconds: the native node's upstream pair may come a report later
    const routeNow = async (): Promise<any> => (await getJson(`${serve.base}/v1/routes/${route.id}`, serve.secret)).body;
    await expect.poll(async () => Object.values((await routeNow()).stages[2].telemetry?.upstreamPairs ?? {}), { timeout: 10_000 }).toEqual([expect.objectContaining({ protocol: 'udp' })]);
    const after = await routeNow();
    expect(after.stages[1].telemetry).toMatchObject({ hop: 'webrtc' });
    const quota = (await peerState(tabs[0]!.page))!;
    expect(quota.load!.cacheError).toMatch(/^STORAGE_QUOTA/);
    expect(quota.status).toBe('ready');
  });
});

describe('a mixed route led by a native node', () => {
  it('a node without WebRTC (--no-webrtc) relays its hidden states to the first tab through the server; tokens identical', async () => {
    const serve = await spawnServe(modelPath, ['--min-peers', '3']);
    const tabs: Tab[] = [];
    try {
      const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', 'lead', '--no-webrtc']);
      await node.waitFor(/joined room/);
      for (const name of ['k1', 'k2']) tabs.push(await openTab(serve, name));
      const route = await waitForRoute(serve, 'ready', 60_000);
      expect(route.stages[0].peerId.startsWith('lead-')).toBe(true);
      expect(await generateOverHttp(serve, route.id, 'mixed: cpu node + 2 tabs')).toEqual(expected);
      const relayed = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.relayed;
      expect(relayed[`${route.stages[0].peerId}->${route.stages[1].peerId}`].frames).toBeGreaterThanOrEqual(N + 1);
      const byStage = (await Promise.all(tabs.map((t) => peerState(t.page)))).sort((a, b) => a!.stage! - b!.stage!);
      expect(byStage.map((s) => s!.hop)).toEqual(['webrtc', 'none']);
    } finally {
      for (const t of tabs) await t.context.close();
      await serve.proc.kill();
    }
  });
});

describe('verification and degraded cases', () => {
  it('a copy with one flipped byte in layer 2, served with the original manifest: that tab refuses naming the tensor, the others serve, no tokens', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gguf-mesh-flip-'));
    const copy = join(dir, 'stories260K.gguf');
    const bytes = new Uint8Array(readFileSync(modelPath));
    const victim = manifest.tensors.find((t) => t.name === 'blk.2.attn_q.weight')!;
    bytes[victim.offset + 17]! ^= 0x40;
    writeFileSync(copy, bytes);
    writeFileSync(`${copy}.manifest.json`, manifestJson(manifest)); // the original's manifest, newer than the copy
    const serve = await spawnServe(copy, ['--min-peers', '3']);
    const tabs: Tab[] = [];
    try {
      for (const name of ['v0', 'v1', 'v2']) tabs.push(await openTab(serve, name));
      const states = await Promise.all(tabs.map((t) => waitForPeerState(t.page, (s) => s.status === 'ready' || s.status === 'failed', 'loaded or refused')));
      const bad = states.find((s) => s.shard!.start <= 2 && 2 < s.shard!.end)!;
      expect(bad.status).toBe('failed');
      expect(bad.error!.code).toBe('TENSOR_HASH_MISMATCH');
      expect(bad.error!.message).toContain('blk.2.attn_q.weight');
      expect(bad.error!.message).toContain(victim.sha256);
      for (const s of states.filter((x) => x !== bad)) expect(s.status).toBe('ready');
      // the refusing tab read the tampered tensor twice (the first read and the one re-fetch)
      const log = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients[bad.peerId!];
      expect((log.ranges as Array<[number, number]>).filter(([a, b]) => a <= victim.offset && victim.offset + victim.byte_length - 1 <= b)).toHaveLength(2);
      const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
      expect(['forming', 'degraded']).toContain(room.route.status);
      expect(room.route.reason).toContain('TENSOR_HASH_MISMATCH');
      const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
      await expect(RouteSessionClient.open(link, room.route.id, { contextLength: 16 })).rejects.toMatchObject({ code: 'ROUTE_UNKNOWN' });
    } finally {
      for (const t of tabs) await t.context.close();
      await serve.proc.kill();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('a model on a third-party host (a hub-like CORS server with Range)', () => {
  it('tabs read their slices from that host without ever sending the room secret, and match llama.cpp', async () => {
    const file = readFileSync(modelPath);
    const seen: Array<{ method: string; range?: string; auth?: string; peer?: string }> = [];
    const hub = createHttpServer((req, res) => {
      seen.push({ method: req.method ?? '', range: req.headers.range, auth: req.headers.authorization, peer: req.headers['x-mesh-peer'] as string | undefined });
      const cors = { 'access-control-allow-origin': '*', 'access-control-expose-headers': 'content-range, content-length, accept-ranges' };
      if (req.method === 'OPTIONS') {
        res.writeHead(204, { ...cors, 'access-control-allow-headers': 'range', 'access-control-allow-methods': 'GET, HEAD' });
        return void res.end();
      }
      const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
      if (!m) {
        res.writeHead(200, { ...cors, 'content-length': file.length, 'accept-ranges': 'bytes' });
        return void res.end(req.method === 'HEAD' ? undefined : file);
      }
      const a = Number(m[1]);
      const b = Math.min(m[2] ? Number(m[2]) : file.length - 1, file.length - 1);
      res.writeHead(206, { ...cors, 'content-range': `bytes ${a}-${b}/${file.length}`, 'content-length': b - a + 1, 'accept-ranges': 'bytes' });
      res.end(req.method === 'HEAD' ? undefined : file.subarray(a, b + 1));
    });
    await new Promise<void>((r) => hub.listen(0, '127.0.0.1', r));
    const hubUrl = `http://127.0.0.1:${(hub.address() as { port: number }).port}/tinyllamas/stories260K.gguf`;
    const serve = await spawnServe(hubUrl, ['--min-peers', '2']);
    const tabs: Tab[] = [];
    try {
      // the server's own reads (header, one streaming pass for the manifest) finish first
      expect((await getJson(`${serve.base}/v1/models/stories260K/manifest`, serve.secret)).body.artifact.sha256).toBe(manifest.artifact.sha256);
      const serverReads = seen.length;
      for (const name of ['h0', 'h1']) tabs.push(await openTab(serve, name));
      const route = await waitForRoute(serve, 'ready', 60_000);
      expect(await generateOverHttp(serve, route.id, 'webrtc x2, model on a third-party host')).toEqual(expected);
      const tabReads = seen.slice(serverReads).filter((r) => r.method === 'GET');
      expect(tabReads.length).toBeGreaterThan(0);
      for (const r of seen.slice(serverReads)) {
        expect(r.auth).toBeUndefined(); // the room secret never leaves for another host
        expect(r.peer).toBeUndefined();
      }
      const fetched = tabReads.reduce((sum, r) => {
        const [, a, b] = /bytes=(\d+)-(\d+)/.exec(r.range!)!;
        return sum + Number(b) - Number(a) + 1;
      }, 0);
      const shards = route.stages.reduce((sum: number, st: any) => sum + shardBytesOf(st.shard), 0);
      expect(fetched).toBeLessThanOrEqual(1.02 * shards);
    } finally {
      for (const t of tabs) await t.context.close();
      await serve.proc.kill();
      await new Promise<void>((r) => hub.close(() => r()));
    }
  });
});
