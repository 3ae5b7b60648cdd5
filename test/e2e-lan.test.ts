// Other devices for real: every host in its own Linux network namespace (test/support/netns.ts),
// `serve` bound to its LAN address (so HTTPS with the local CA it makes), headless Chromium tabs
// in other namespaces trusting that CA through their profile's NSS database, a native node and a
// client (`generate --join`, pinning the CA by the link's fingerprint) in others.
//
//   LAN        a tab loads its slice over HTTPS (verified, cached), runs WebGPU, and serves a
//              route with a tab in a fourth namespace and a native node in a third: WebRTC tab→tab
//              on mDNS host candidates, tab→native peer to peer; tokens equal llama.cpp's, and
//              the session names each hop with its candidate pair, bytes and time
//   embedding  another site's HTTPS page loads <gguf-mesh-peer> by one script tag from the room
//              server and serves layers after a native node (native → tab over WebRTC)
//   TURN       two tabs on links that do not reach each other, each reaching the server's host:
//              their hop goes through coturn with credentials serve mints
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { X509Certificate } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Page } from 'playwright-core';
import type { LlamaModel } from 'node-llama-cpp';
import { NetLab } from './support/netns.ts';
import { launchInHost } from './support/lab-browser.ts';
import { expectDirectPair } from './support/browser-route.ts';
import { api, generateIn as generateInLab, goto, openRoomPage, readyRoute, serveIn as serveInLab } from './support/lab-room.ts';
import type { Served } from './support/lab-room.ts';
import type { LabBrowser } from './support/lab-browser.ts';
import { killAll, spawnCommand, spawnMesh } from './support/mesh.ts';
import type { MeshProcess } from './support/mesh.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { artifactPath, ensureBuilt } from './fixtures/ui/harness.ts';
import { certFingerprint, issueServerCert, makeLocalCa } from '../signaling-server/local-ca.ts';
import { parseJoinUrl } from '../src/protocol/control.ts';
import { REPO_ROOT } from './support/cli.ts';

const N = 16;
let modelPath: string;
let expected: number[];
let llama: LlamaModel;
const scratch = mkdtempSync(join(tmpdir(), 'gguf-mesh-lan-'));
/** serve's cache dir: its local CA lives in tls/ under it */
const serveCache = join(scratch, 'serve-cache');

beforeAll(async () => {
  modelPath = await stories260K();
  llama = await loadModel(modelPath);
  expected = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, N);
  await ensureBuilt(); // serve --ui dist: the room page and the component bundle
});

afterAll(async () => {
  await llama?.dispose();
  await killAll();
  rmSync(scratch, { recursive: true, force: true });
});

const serveIn = (lab: NetLab, host: string, extra: string[]): Promise<Served> => serveInLab(lab, host, modelPath, serveCache, extra);
const generateIn = (lab: NetLab, host: string, joinUrl: string): Promise<any> => generateInLab(lab, host, joinUrl, N);

describe('a LAN of namespaces: serve, two tabs and a native node on four hosts', () => {
  let lab: NetLab;
  let served: Served;
  const browsers: LabBrowser[] = [];
  let tab1: Page;
  let tab2: Page;
  let node: MeshProcess;
  /** a cpu node in host nat, listening on its LAN address, its verified shards cached */
  const spawnNode = (joinUrl: string, name: string): MeshProcess =>
    spawnMesh(['node', '--join', joinUrl, '--backend', 'cpu', '--memory', '4GiB', '--name', name, '--listen', `${lab.host('nat').ip}:0`, '--cache-dir', join(scratch, `shards-${name}`)], { prefix: lab.exec('nat', []) });

  beforeAll(async () => {
    lab = await NetLab.create({ lan: ['srv', 'nat', 'tab1', 'tab2', 'tab3', 'tab4', 'cli', 'site', 'emb'] });
    served = await serveIn(lab, 'srv', ['--min-peers', '3']);
  });
  afterAll(async () => {
    for (const b of browsers) await b.close();
    await killAll();
    lab?.close();
  });

  it('serve bound to a LAN address speaks HTTPS with a CA constrained to its names, its keys owner-only', () => {
    expect(served.origin).toBe(`https://${lab.host('srv').ip}:${new URL(served.origin).port}`);
    expect(parseJoinUrl(served.joinUrl).params.get('ca')).toBe(certFingerprint(served.ca));
    const leaf = new X509Certificate(readFileSync(join(serveCache, 'tls', 'server.pem')));
    expect(leaf.checkIP(lab.host('srv').ip)).toBe(lab.host('srv').ip);
    expect(leaf.verify(new X509Certificate(served.ca).publicKey)).toBe(true);
    for (const key of ['ca-key.pem', 'server-key.pem']) expect(statSync(join(serveCache, 'tls', key)).mode & 0o777).toBe(0o600);
  });

  it('a tab in another namespace loads its slice over HTTPS, runs WebGPU, and serves a route with a tab in a fourth and a native node in a third: llama.cpp\'s tokens, each hop named', async () => {
    browsers.push(await launchInHost(lab, 'tab1', [served.ca]), await launchInHost(lab, 'tab2', [served.ca]));
    tab1 = await openRoomPage(browsers[0]!, served.joinUrl, 'tab1');
    const facts = await tab1.evaluate(async () => {
      const pc = new RTCPeerConnection();
      pc.createDataChannel('probe');
      const cands: string[] = [];
      pc.onicecandidate = (e) => e.candidate && cands.push(e.candidate.address ?? '');
      await pc.setLocalDescription(await pc.createOffer());
      await new Promise((r) => setTimeout(r, 500));
      pc.close();
      return { secure: isSecureContext, adapter: Boolean(await navigator.gpu?.requestAdapter()), subtle: Boolean(crypto.subtle), cands };
    });
    // a secure context with WebGPU — and Chromium's default host candidates: mDNS names, not addresses
    expect(facts).toMatchObject({ secure: true, adapter: true, subtle: true });
    expect(facts.cands.length).toBeGreaterThan(0);
    for (const c of facts.cands) expect(c).toMatch(/\.local$/);
    tab2 = await openRoomPage(browsers[1]!, served.joinUrl, 'tab2');
    node = spawnNode(served.joinUrl, 'native');
    await node.waitFor(/joined room/);

    const route = await readyRoute(tab1, served);
    expect(route.stages.map((s: any) => s.peerId.split('-')[0])).toEqual(['tab', 'tab', 'native']);
    const result = await generateIn(lab, 'cli', served.joinUrl);
    expect(result.tokens).toEqual(expected);

    // each hop: a direct data channel (tab→tab, tab→native: no relay at either end), its bytes and time
    expect(result.hops.map((h: any) => h.kind)).toEqual(['webrtc', 'webrtc']);
    for (const hop of result.hops) {
      expectDirectPair(hop.candidatePair);
      expect(hop.bytes).toBeGreaterThan(0);
      expect(hop.transferMs).toBeGreaterThan(0);
      expect(hop.steps).toBe(N);
    }
    console.log(`[lan] tokens ${JSON.stringify(result.tokens)}; hops ${result.hops.map((h: any) => `${h.from}→${h.to} ${h.kind} ${h.candidatePair.local}/${h.candidatePair.remote} ${h.bytes} B ${h.transferMs} ms`).join('; ')}`);

    // each tab fetched its slice (verified, cached): nothing beyond its shard's tensors
    const fetches = (await api(tab1, served, `/v1/models/stories260K/fetches`)).clients;
    for (const st of route.stages.slice(0, 2)) {
      expect(st.telemetry.cache).toMatchObject({ hit: [], error: null });
      expect(st.telemetry.cache.fetched.length).toBeGreaterThan(0);
      expect(fetches[st.peerId].bytes).toBeGreaterThan(0);
      expect(fetches[st.peerId].bytes).toBeLessThanOrEqual(st.bytesRead);
    }
  });

  it('reloaded tabs and a restarted node serve their layers again from their caches, fetching nothing', async () => {
    const before = await readyRoute(tab1, served);
    // every peer rejoins, so each advertises the range it holds and the planner keeps them
    await node.kill();
    for (const t of [tab1, tab2]) await t.reload();
    node = spawnNode(served.joinUrl, 'native');
    await node.waitFor(/joined room/);
    const deadline = Date.now() + 45_000;
    let after = await readyRoute(tab1, served);
    while (after.stages.some((s: any) => before.stages.some((b: any) => b.peerId === s.peerId)) && Date.now() < deadline) after = await readyRoute(tab1, served);
    expect(after.stages.map((s: any) => s.shard)).toEqual(before.stages.map((s: any) => s.shard));
    for (const st of after.stages) expect(st.bytesRead).toBe(0);
    for (const st of after.stages.slice(0, 2)) {
      expect(st.telemetry.cache.fetched).toEqual([]);
      expect(st.telemetry.cache.hit.length).toBeGreaterThan(0);
    }
    expect((await generateIn(lab, 'cli', served.joinUrl)).tokens).toEqual(expected);
  });

  it('a newcomer whose model hosting is blocked loads its standby shard from a tab on another host over WebRTC; that tab\'s panel thanks it', async () => {
    const route = await readyRoute(tab1, served);
    // the first spare takes the last stage's shard (the native node's: no tab holds it), the second the tab-served stage 1's
    browsers.push(await launchInHost(lab, 'tab3', [served.ca]), await launchInHost(lab, 'tab4', [served.ca]));
    const spares = async (): Promise<any[]> => (await api(tab1, served, `/v1/routes/${route.id}`)).spares;
    await openRoomPage(browsers.at(-2)!, served.joinUrl, 'tab3');
    const deadline = Date.now() + 60_000;
    while (!(await spares()).some((s) => s.status === 'ready') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
    const context = await browsers.at(-1)!.browser.newContext();
    let blocked = 0;
    await context.route(/\/models\/[^/]+\.gguf/, (r) => (blocked++, r.abort('blockedbyclient')));
    const page = await context.newPage();
    await goto(page, served.joinUrl);
    let spare: any;
    while (Date.now() < deadline) {
      spare = (await spares()).find((s) => s.stage === 1);
      if (spare?.status === 'ready' || spare?.status === 'failed') break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(spare?.status).toBe('ready');
    expect(blocked).toBe(0);
    const fetches = (await api(tab1, served, `/v1/models/stories260K/fetches`)).clients;
    expect(fetches[spare.peerId]).toBeUndefined();
    const source = route.stages[1].peerId.startsWith('tab-') ? [tab1, tab2] : [];
    const thanks = await Promise.all(source.map((t) => t.locator('.peer-view .thanks').textContent()));
    expect(thanks.some((t) => /Thank you for helping: this tab sent [\d.]+ \w+ of the model/.test(t ?? ''))).toBe(true);
    console.log(`[lan p2p] ${spare.peerId} holds layers ${spare.shard.start}-${spare.shard.end} with 0 bytes from the server; ${thanks.filter(Boolean).join(' ')}`);
    await context.close();
  });

  it('the landing page offers the CA certificate and its fingerprint; plain HTTP beyond loopback needs --insecure-http and leaves tabs without WebGPU', async () => {
    const page = await (await browsers[0]!.browser.newContext()).newPage();
    await goto(page, `${served.origin}/`);
    await page.waitForSelector('.trust:not([hidden]) .fingerprint');
    const shown = await page.evaluate(() => document.querySelector('.trust .fingerprint')!.textContent);
    expect(shown!.replace(/:/g, '').toLowerCase()).toBe(certFingerprint(served.ca));
    const der = await page.evaluate(async () => {
      const href = document.querySelector<HTMLAnchorElement>('.trust a[download]')!.href;
      return [...new Uint8Array(await crypto.subtle.digest('SHA-256', await (await fetch(href)).arrayBuffer()))].map((b) => b.toString(16).padStart(2, '0')).join('');
    });
    expect(der).toBe(certFingerprint(served.ca));
    await page.screenshot({ path: artifactPath('lan-landing.png'), fullPage: true });

    const plain = spawnMesh(['serve', '--host', lab.host('srv').ip, '--port', '0', '--ui', 'dist', '--insecure-http', '--model', modelPath], { prefix: lab.exec('srv', []), env: { GGUF_MESH_CACHE: serveCache } });
    const [, plainJoin] = await plain.waitFor(/join:\s+(\S+)/);
    expect(plainJoin).toMatch(/^http:\/\//);
    expect(plain.output()).toMatch(/plain HTTP on 10\.\d+\.\d+\.\d+: other devices get no WebGPU/);
    await goto(page, plainJoin!);
    await page.waitForSelector('.trust:not([hidden])');
    expect(await page.evaluate(() => ({ secure: isSecureContext, gpu: 'gpu' in navigator, title: document.querySelector('.trust h2')!.textContent }))).toEqual({ secure: false, gpu: false, title: 'This page is not secure' });
    await plain.kill();
  });

  it('another site\'s HTTPS page loads <gguf-mesh-peer> by one script tag from the room server and serves layers after a native node', async () => {
    const room = await serveIn(lab, 'srv', ['--min-peers', '2']);
    expect(certFingerprint(room.ca)).toBe(certFingerprint(served.ca)); // the cached CA, reused
    // the other site has a certificate of its own (its own CA, for its own address)
    const site = lab.host('site');
    const siteCa = await makeLocalCa({ ips: [site.ip], dns: [] }, 'the other site test CA');
    const siteLeaf = await issueServerCert(siteCa, { ips: [site.ip], dns: [] });
    writeFileSync(join(scratch, 'site.pem'), siteLeaf.cert + siteCa.cert);
    writeFileSync(join(scratch, 'site-key.pem'), siteLeaf.key);
    const siteProc = spawnCommand(lab.exec('site', [process.execPath, join(REPO_ROOT, 'bin', 'run-ts.js'), join(REPO_ROOT, 'test', 'fixtures', 'embed-site', 'server.ts'), site.ip, join(scratch, 'site.pem'), join(scratch, 'site-key.pem'), room.origin, room.joinUrl]));
    const [, siteUrl] = await siteProc.waitFor(/site listening on (\S+)/);

    const lead = spawnNode(room.joinUrl, 'lead');
    await lead.waitFor(/joined room/);
    const b = await launchInHost(lab, 'emb', [room.ca, siteCa.cert]);
    browsers.push(b);
    const page = await (await b.browser.newContext()).newPage();
    const errors: string[] = [];
    page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    await goto(page, siteUrl!);
    await page.waitForFunction(() => document.querySelector('gguf-mesh-peer')?.state?.status === 'ready', null, { timeout: 60_000 }).catch(async (e: Error) => {
      const s = await page.evaluate(() => JSON.stringify(document.querySelector('gguf-mesh-peer')?.state ?? null));
      throw new Error(`${e.message}\nstate: ${s}\nconsole errors: ${errors.join('\n')}\nserve: ${room.proc.output().slice(-2000)}`);
    });
    const state = await page.evaluate(() => JSON.parse(JSON.stringify(document.querySelector('gguf-mesh-peer')!.state)));
    expect(state).toMatchObject({ stage: 1, hop: 'none' });
    expect(await page.evaluate(() => location.origin)).toBe(siteUrl!.replace(/\/$/, ''));

    const result = await generateIn(lab, 'cli', room.joinUrl);
    expect(result.tokens).toEqual(expected);
    expect(result.hops).toEqual([expect.objectContaining({ from: 0, to: 1, kind: 'webrtc', candidatePair: expect.objectContaining({ protocol: 'udp' }) })]);
    expect(errors).toEqual([]);
    await room.proc.kill();
  });
});

describe('TURN: two tabs that cannot reach each other meet through coturn', () => {
  let lab: NetLab;
  const browsers: LabBrowser[] = [];

  beforeAll(async () => {
    lab = await NetLab.create({ star: { centre: 'hub', leaves: ['ta', 'tb'] } });
  });
  afterAll(async () => {
    for (const b of browsers) await b.close();
    await killAll();
    lab?.close();
  });

  it('serve announces coturn and mints each tab a short-lived credential; the hop goes through the relay and the tokens are llama.cpp\'s', async () => {
    const hub = lab.host('hub');
    const secret = Buffer.from(crypto.getRandomValues(new Uint8Array(18))).toString('base64url');
    const turn = spawnCommand(
      lab.exec('hub', ['turnserver', '-n', `--listening-ip=${hub.ip}`, `--relay-ip=${hub.ip}`, '--listening-port=3478', '--min-port=49152', '--max-port=49300', '--use-auth-secret', `--static-auth-secret=${secret}`, '--realm=gguf-mesh.test', '--no-tls', '--no-dtls', '--no-cli', '--fingerprint', '--log-file=stdout', '--simple-log', '--verbose']),
    );
    await turn.waitFor(/Total General servers|IPv4\. UDP listener opened on/, 20_000);
    const served = await serveIn(lab, 'hub', ['--min-peers', '2', '--ice-server', `turn:${hub.ip}:3478`, '--turn-secret', secret, '--turn-ttl', '600']);
    for (const leaf of ['ta', 'tb']) browsers.push(await launchInHost(lab, leaf, [served.ca]));
    const ta = await openRoomPage(browsers[0]!, served.joinUrl, 'ta');
    await openRoomPage(browsers[1]!, served.joinUrl, 'tb');
    // the leaves share no route: the data channel cannot form on host candidates
    const route = await readyRoute(ta, served, 90_000);
    expect(route.hops).toEqual([expect.objectContaining({ kind: 'webrtc' })]);
    // through the relay: one side's candidate is coturn's relay address (the other may be that side's own, reflexive)
    expect([route.hops[0].candidatePair.local, route.hops[0].candidatePair.remote]).toContain('relay');

    const result = await generateIn(lab, 'hub', served.joinUrl);
    expect(result.tokens).toEqual(expected);
    expect(result.hops[0]).toMatchObject({ kind: 'webrtc', candidatePair: route.hops[0].candidatePair });
    expect(result.hops[0].bytes).toBeGreaterThan(0);
    // coturn saw minted usernames (<unix expiry>:<peer id>), never a static one
    const users = [...turn.output().matchAll(/ user <([^>]+)>/g)].map((m) => m[1]!);
    expect(users.length).toBeGreaterThan(0);
    for (const u of new Set(users)) {
      const [expiry] = u.split(':');
      expect(Number(expiry) - Date.now() / 1000).toBeGreaterThan(0);
      expect(Number(expiry) - Date.now() / 1000).toBeLessThanOrEqual(600);
    }
    console.log(`[turn] hop ${JSON.stringify(result.hops[0])}; coturn users ${[...new Set(users)].join(', ')}`);
  });
});
