// The link matrix in a lab where the star through the server is wrong: `serve` on a link the
// shaping router delays by 30 ms each way, native nodes a and b on undelayed links (so each is
// 60 ms of round trip from the server and well under a millisecond from the other), c on a link
// delayed 15 ms (90 ms from the server, 30 from a and b). a and b can each hold only part of the
// model, c all of it. Through the star, the hop a → b costs a whole server round trip, so the
// speed planner would serve from c alone; with the round trips the nodes measured to each other
// at join (`probe-links`), it chains a → b. The test checks the matrix the room shows, both
// planners' choices on the same figures, and that the chain the matrix picked decodes faster
// than c alone — measured, each room served in turn, by a client next to the server — with the
// same greedy tokens. Then b's link gets 80 ms longer each way (the router reshapes it): the
// room times its pairs again every second, the idle re-planner sees a → b's round trip move and
// plans the route off b, and the tokens stay the same. Every delay is on the wire (the router),
// so no choice rests on a timing of compute.
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetLab } from './support/netns.ts';
import { generateIn } from './support/lab-room.ts';
import { killAll, spawnMesh } from './support/mesh.ts';
import type { MeshProcess } from './support/mesh.ts';
import { stories260K } from './support/models.ts';
import { choosePlan } from '../signaling-server/plan-choice.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { GgufHeader } from '../src/gguf/types.ts';

const SERVER_DELAY_MS = 30;
const C_DELAY_MS = 15;
/** b's link later: a → b then costs more than going round by c, whatever the server has yet learnt of b's own round trip */
const B_LATER_DELAY_MS = 80;
/** a or b alone cannot hold stories260K (1,171,200 bytes of shards), three of its five layers they can */
const PART_MEMORY = '700000';
const N = 24;

let lab: NetLab;
let model: string;
let header: GgufHeader;

beforeAll(async () => {
  model = await stories260K();
  const source = await openTensorSource(model);
  header = source.header;
  await source.close();
  lab = await NetLab.create({ routed: { hosts: ['srv', 'a', 'b', 'c'], links: { srv: { delayMs: SERVER_DELAY_MS }, c: { delayMs: C_DELAY_MS } } } });
});

afterAll(async () => {
  await killAll();
  lab?.close();
});

/** A room on `srv` with the named nodes; resolves once its route is ready. */
async function room(nodes: Array<{ name: string; memory: string; extra?: string[] }>): Promise<{ serve: MeshProcess; joinUrl: string; secret: string; roomId: string }> {
  const srv = lab.host('srv');
  const serve = spawnMesh(['serve', '--host', srv.ip, '--port', '0', '--ui', 'off', '--model', model, '--min-peers', String(nodes.length), '--plan-delay', '2500', '--standby', 'off', '--planner', 'speed', '--insecure-http', '--link-probe-interval', '1000'], { prefix: lab.exec('srv', []) });
  const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/, 60_000);
  const procs = nodes.map((n) => spawnMesh(['node', '--join', joinUrl!, '--backend', 'cpu', '--memory', n.memory, '--no-cache', '--name', n.name, '--listen', `${lab.host(n.name).ip}:0`, ...(n.extra ?? [])], { prefix: lab.exec(n.name, []) }));
  await serve.waitFor(/route \d+: ready/, 120_000).catch((e: Error) => {
    throw new Error(`${e.message}\n${serve.output()}\n${procs.map((p) => p.output()).join('\n')}`);
  });
  const url = new URL(joinUrl!);
  return { serve, joinUrl: joinUrl!, secret: new URLSearchParams(url.hash.slice(1)).get('secret')!, roomId: url.pathname.split('/').pop()! };
}

/** GET a path of the room server from inside its namespace (the test process is in none). */
function apiInLab(joinUrl: string, secret: string, path: string): any {
  const origin = new URL(joinUrl).origin;
  const script = `fetch(${JSON.stringify(origin + path)}, { headers: { authorization: 'Bearer ' + ${JSON.stringify(secret)} } }).then((r) => r.text()).then((t) => process.stdout.write(t))`;
  const [cmd, ...argv] = lab.exec('srv', [process.execPath, '-e', script]);
  return JSON.parse(execFileSync(cmd!, argv, { encoding: 'utf8' }));
}

describe('peers close to each other, far from the server', () => {
  it('measures their links at join, chains the close pair the star would pass over, decodes faster than the far peer alone, and moves off a link that got longer', async () => {
    const shaped = await room([
      { name: 'a', memory: PART_MEMORY },
      { name: 'b', memory: PART_MEMORY },
      { name: 'c', memory: '4GiB' },
    ]);
    const { peers } = apiInLab(shaped.joinUrl, shaped.secret, `/v1/rooms/${shaped.roomId}/peers`);
    const byName = (n: string) => peers.find((p: any) => p.name === n);
    const [a, b, c] = ['a', 'b', 'c'].map(byName);
    console.log(`[links] server rtt ms: ${peers.map((p: any) => `${p.name} ${p.rttMs?.toFixed(1)}`).join(', ')}; measured: a–b ${a.links[b.id]?.rttMs}, a–c ${a.links[c.id]?.rttMs}, b–c ${b.links[c.id]?.rttMs}`);
    for (const p of [a, b, c]) {
      // the heartbeat crosses the delayed links twice
      expect(p.rttMs).toBeGreaterThanOrEqual(2 * SERVER_DELAY_MS + (p === c ? 2 * C_DELAY_MS : 0));
      for (const q of [a, b, c].filter((x) => x !== p)) expect(p.links[q.id], `${p.name} → ${q.name}`).toMatchObject({ source: 'probe' });
    }
    expect(a.links[b.id].rttMs).toBeLessThan(5); // no delayed link between them
    for (const p of [a, b]) {
      expect(p.links[c.id].rttMs).toBeGreaterThanOrEqual(2 * C_DELAY_MS);
      expect(p.links[c.id].rttMs).toBeLessThan(2 * C_DELAY_MS + 5);
    }
    // both planners on the room's own figures: the star serves from c alone, the matrix chains a and b
    const candidates = peers.map((p: any) => ({ id: p.id, memoryBytes: p.plannedMemoryBytes, serves: 'ranges' as const, speed: p.speed, rttMs: p.rttMs }));
    const links = { oneWayMs: (x: string, y: string) => (peers.find((p: any) => p.id === x)?.links[y]?.rttMs ?? NaN) / 2 };
    const star = choosePlan('speed', header, 5, candidates);
    const matrix = choosePlan('speed', header, 5, candidates, undefined, links);
    expect(star.plan.ok && star.plan.stages.map((s) => s.peerId)).toEqual([c.id]);
    const chain = matrix.plan.ok ? matrix.plan.stages.map((s) => s.peerId) : [];
    expect(new Set(chain)).toEqual(new Set([a.id, b.id]));
    const route = apiInLab(shaped.joinUrl, shaped.secret, `/v1/rooms/${shaped.roomId}`).route;
    const stages = apiInLab(shaped.joinUrl, shaped.secret, `/v1/routes/${route.id}`).stages.map((s: any) => s.peerId);
    expect(stages).toEqual(chain); // what the room planned
    const chained = await generateIn(lab, 'srv', shaped.joinUrl, N);
    // the hop a → b's share of each token's wire time, by the links' latencies: its sliver, not a third of the server's round trip
    const hop = chained.hops[0];
    console.log(`[links] hop ${hop.fromPeer} → ${hop.toPeer}: ${hop.kind}, ${hop.transferMs} ms over ${hop.steps} steps`);
    expect(hop.kind).toBe('ws');
    expect(hop.transferMs / hop.steps).toBeLessThan(3);

    // b's link gets longer: the pairs timed again see it, and the idle route moves off b
    await lab.reshape('b', { delayMs: B_LATER_DELAY_MS });
    await shaped.serve.waitFor(new RegExp(`link \\S+ ↔ \\S+ now [\\d.]+ ms round trip \\(was [\\d.]+\\): weighing the idle route again`), 30_000);
    await shaped.serve.waitFor(new RegExp(`route ${route.id}: re-planned: `), 30_000);
    const roomApi = (path = ''): any => apiInLab(shaped.joinUrl, shaped.secret, `/v1/rooms/${shaped.roomId}${path}`);
    await expect.poll(() => roomApi().route, { timeout: 60_000, interval: 500 }).toMatchObject({ status: 'ready' });
    const replanned = apiInLab(shaped.joinUrl, shaped.secret, `/v1/routes/${roomApi().route.id}`).stages.map((s: any) => s.peerId);
    const ab = roomApi('/peers').peers.find((p: any) => p.id === a.id).links[b.id].rttMs;
    console.log(`[links] b's link +${B_LATER_DELAY_MS} ms each way: a–b measured ${ab} ms; the route re-planned to ${replanned.join(' → ')}`);
    expect(ab).toBeGreaterThanOrEqual(2 * B_LATER_DELAY_MS);
    expect(replanned).not.toContain(b.id);
    expect((await generateIn(lab, 'srv', shaped.joinUrl, N)).tokens).toEqual(chained.tokens);
    await lab.reshape('b', {});
    await killAll();
    // the star's choice, served: c alone in a room of its own
    const alone = await room([{ name: 'c', memory: '4GiB' }]);
    const single = await generateIn(lab, 'srv', alone.joinUrl, N);
    const ms = (r: any) => r.timings.decode_ms / Math.max(1, r.tokens.length - 1);
    console.log(`[links] decode ms/token: a → b ${ms(chained).toFixed(1)} (predicted ${matrix.predictedMs?.toFixed(1)}), c alone ${ms(single).toFixed(1)} (predicted by the star ${star.predictedMs?.toFixed(1)})`);
    expect(chained.tokens).toEqual(single.tokens);
    // 90 ms of wire a token against 60 (the shaper, a user-space process, adds its own under load: no tighter bound here)
    expect(ms(single)).toBeGreaterThan(ms(chained));
  }, 240_000);
});
