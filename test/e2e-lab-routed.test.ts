// Chromium tabs across the shaping router (test/support/netns.ts, the `routed` topology): `serve`
// in one host, a tab in each of two others on links the router delays (and jitters), a route
// across both tabs. Multicast does not cross the router, so a tab's mDNS host candidate
// (<uuid>.local) means nothing to the other tab: the data channel forms on the server-reflexive
// candidate serve's own STUN (signaling-server/stun.ts) lets each tab learn — as it would for a
// person on two networks. Without it (serve --stun off) the hop relays through the server.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { NetLab } from './support/netns.ts';
import type { LinkShape } from './support/netns.ts';
import { launchInHost } from './support/lab-browser.ts';
import type { LabBrowser } from './support/lab-browser.ts';
import { generateIn, openRoomPage, readyRoute, serveIn } from './support/lab-room.ts';
import { killAll } from './support/mesh.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { ensureBuilt } from './fixtures/ui/harness.ts';

const N = 12;
/** one-way delay (± jitter) the router adds on each tab's link; serve's link has none */
const LINKS: Record<string, LinkShape> = { ta: { delayMs: 15 }, tb: { delayMs: 10, jitterMs: 2 } };
const d = (h: string): number => LINKS[h]!.delayMs ?? 0;
const j = (h: string): number => LINKS[h]!.jitterMs ?? 0;
let modelPath: string;
let expected: number[];
let llama: LlamaModel;
const scratch = mkdtempSync(join(tmpdir(), 'gguf-mesh-routed-'));

beforeAll(async () => {
  modelPath = await stories260K();
  llama = await loadModel(modelPath);
  expected = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, N);
  await ensureBuilt();
});

afterAll(async () => {
  await llama?.dispose();
  await killAll();
  rmSync(scratch, { recursive: true, force: true });
});

describe('two tabs on two shaped links: the route crosses the router', () => {
  let lab: NetLab;
  const browsers: LabBrowser[] = [];
  const serveCache = join(scratch, 'serve-cache');

  beforeAll(async () => {
    lab = await NetLab.create({ routed: { hosts: ['srv', 'ta', 'tb'], links: LINKS } });
  });
  afterAll(async () => {
    for (const b of browsers) await b.close();
    await killAll();
    lab?.close();
  });

  it('tab → tab over WebRTC on serve\'s own STUN (a server-reflexive candidate): llama.cpp\'s tokens, a hop round trip and a token time that carry the router\'s delay', async () => {
    const served = await serveIn(lab, 'srv', modelPath, serveCache, ['--min-peers', '2']);
    const [, stunAt] = served.proc.output().match(/stun: +udp (\S+)/) ?? []; // on by default beyond loopback
    expect(stunAt).toBe(`${lab.host('srv').ip}:${new URL(served.origin).port}`);
    for (const h of ['ta', 'tb']) browsers.push(await launchInHost(lab, h, [served.ca]));
    const ta = await openRoomPage(browsers[0]!, served.joinUrl, 'ta');
    // what a tab can offer: alone, only its mDNS name (meaningless past its link); asking serve, also its address
    const gather = (iceServers: RTCIceServer[]): Promise<string[]> =>
      ta.evaluate(async (servers) => {
        const pc = new RTCPeerConnection({ iceServers: servers });
        pc.createDataChannel('probe');
        const found: string[] = [];
        const done = new Promise<void>((r) => (pc.onicecandidate = (e) => (e.candidate ? found.push(`${e.candidate.type} ${e.candidate.address}`) : r())));
        await pc.setLocalDescription(await pc.createOffer());
        await done;
        pc.close();
        return found;
      }, iceServers);
    const alone = await gather([]);
    expect(alone.length).toBeGreaterThan(0);
    for (const c of alone) expect(c).toMatch(/^host [0-9a-f-]+\.local$/);
    expect(await gather([{ urls: `stun:${stunAt}` }])).toContain(`srflx ${lab.host('ta').ip}`);
    await openRoomPage(browsers[1]!, served.joinUrl, 'tb');
    const route = await readyRoute(ta, served, 90_000);
    expect(route.stages.map((s: any) => s.peerId.split('-')[0])).toEqual(['tab', 'tab']);

    const result = await generateIn(lab, 'srv', served.joinUrl, N);
    expect(result.tokens).toEqual(expected);
    expect(result.hops).toEqual([expect.objectContaining({ from: 0, to: 1, kind: 'webrtc', steps: N })]);
    const pair = result.hops[0].candidatePair;
    // no host/host pair can form (the other side's .local name does not resolve here) and no TURN was offered:
    // one side reached the other's address as serve's STUN reported it (srflx), or as its checks revealed it (prflx)
    expect(pair).toMatchObject({ protocol: 'udp' });
    expect(['srflx', 'prflx']).toContain(pair.remote);
    expect([pair.local, pair.remote]).not.toContain('relay');
    // what proves the frames crossed the shaper: ICE's own round trip on the pair, and the time of a token
    const rtt = 2 * (d('ta') + d('tb')) - 2 * j('tb');
    expect(pair.rttMs).toBeGreaterThanOrEqual(rtt);
    const msPerToken = 1000 / result.timings.decode_tok_s;
    expect(msPerToken).toBeGreaterThanOrEqual(rtt); // stage 0 → stage 1 → (token) → stage 0, at least once a token
    console.log(`[routed] hop ${pair.local}/${pair.remote} ${pair.protocol} rtt ${pair.rttMs} ms (router adds ${2 * (d('ta') + d('tb'))} ± ${2 * j('tb')}); decode ${msPerToken.toFixed(1)} ms/token; hop ${result.hops[0].bytes} B, transfer ${result.hops[0].transferMs} ms over ${N} steps`);
  });
});
