// Several `serve` instances sharing one Redis (serve --redis, signaling-server/cluster.ts): a real
// redis-server on a loopback port, real `serve` and `node` processes on stories260K, and a TCP
// load balancer in front (test/support/tcp-balancer.ts) as a deployment would have. One
// instance holds the room at a time (a lease fenced by an epoch); the other passes its peers,
// clients and API requests on over a direct link; completions through either instance give
// llama.cpp's greedy tokens; killing the holder passes the room to the other, whose peers rejoin
// through the balancer, and a frame-API client's session goes on there with the same tokens;
// peers joining both instances at once get one plan, never two.
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { preferredInstance } from '../signaling-server/cluster.ts';
import { Directory } from '../signaling-server/directory.ts';
import { isMeshError } from '../src/errors.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { TelemetryEvent } from '../src/route/telemetry.ts';
import type { SamplerSettings } from '../src/protocol/session.ts';
import { getJson, killAll, spawnCommand, spawnMesh } from './support/mesh.ts';
import type { MeshProcess } from './support/mesh.ts';
import { freePort } from './support/ports.ts';
import { readSse } from './support/sse.ts';
import { STORIES_CONTINUATION_PREFIX, STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';
import { startTcpBalancer } from './support/tcp-balancer.ts';
import type { TcpBalancer } from './support/tcp-balancer.ts';

const SECRET = 'cluster-test-secret';
const LEASE_MS = 1500;
let model: string;
let redisUrl: string;
const balancers: TcpBalancer[] = [];

beforeAll(async () => {
  model = await stories260K();
  try {
    execFileSync('redis-server', ['--version']);
  } catch {
    throw new Error('redis-server is not installed: apt-get install -y redis-server (.ci/run does)');
  }
  const port = await freePort();
  const redis = spawnCommand(['redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {}, 'redis-server');
  await redis.waitFor(/Ready to accept connections/, 20_000);
  redisUrl = `redis://127.0.0.1:${port}`;
}, 60_000);

afterAll(async () => {
  for (const b of balancers) await b.close();
  await killAll();
});

interface Instance {
  proc: MeshProcess;
  base: string;
  port: number;
}

async function instance(prefix: string, extra: string[] = [], port?: number): Promise<Instance> {
  port ??= await freePort();
  const proc = spawnMesh(['serve', '--port', String(port), '--ui', 'off', '--model', model, '--secret', SECRET, '--redis', redisUrl, '--redis-prefix', prefix, '--redis-lease', String(LEASE_MS), ...extra]);
  await proc.waitFor(/join:\s+(\S+)/);
  return { proc, base: `http://127.0.0.1:${port}`, port };
}

async function roomIdOf(i: Instance): Promise<string> {
  return (await getJson(`${i.base}/v1/rooms`, SECRET)).body.rooms[0].id;
}

async function health(i: Instance): Promise<any> {
  return (await fetch(`${i.base}/v1/health`)).json();
}

async function holderOf(instances: Instance[]): Promise<Instance> {
  for (;;) {
    for (const i of instances) if ((await health(i)).cluster?.holds === 1) return i;
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function waitReady(base: string, roomId: string, stages: number, timeoutMs = 60_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const room = await getJson(`${base}/v1/rooms/${roomId}`, SECRET).catch(() => null);
    const r = room?.body.route;
    if (r?.status === 'ready') {
      const route = (await getJson(`${base}/v1/routes/${r.id}`, SECRET)).body;
      if (route.stages.length === stages) return route;
    }
    if (Date.now() > deadline) throw new Error(`no ready route of ${stages} stages at ${base}: ${JSON.stringify(room?.body)}`);
    await new Promise((r) => setTimeout(r, 150));
  }
}

async function complete(base: string, stream = false): Promise<string> {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 0, stream }),
  });
  expect(res.status, await res.clone().text()).toBe(200);
  if (!stream) return ((await res.json()) as any).choices[0].text;
  const text = await res.text();
  return [...text.matchAll(/^data: (\{.*\})$/gm)].map((m) => JSON.parse(m[1]!).choices?.[0]?.text ?? '').join('');
}

interface Piece {
  text: string;
  /** the last event's id (what a reconnect sends as Last-Event-ID) */
  lastId: string | null;
  ids: string[];
  errors: string[];
  done: boolean;
}

/**
 * fetch as an EventSource connects: a network error before any response (a kept-alive
 * connection to the balancer that died with the killed instance, just as it is reused) is tried
 * again on a new connection after a moment; an HTTP answer, whatever its status, is the caller's.
 */
async function eventSourceFetch(url: string, init: RequestInit, tries = 5): Promise<Response> {
  for (let i = 1; ; i++) {
    try {
      return await fetch(url, init);
    } catch (e) {
      if (i >= tries || !(e instanceof TypeError)) throw e;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

/** A streamed request read until it ends or breaks off (its instance killed, or `cut` after that many text pieces). */
async function streamPiece(base: string, body: Record<string, unknown>, opts: { lastEventId?: string; onPiece?: (pieces: number) => void; cut?: number } = {}): Promise<Piece> {
  const ctl = new AbortController();
  const res = await eventSourceFetch(`${base}/v1/completions`, {
    method: 'POST',
    signal: ctl.signal,
    headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json', ...(opts.lastEventId ? { 'last-event-id': opts.lastEventId } : {}) },
    body: JSON.stringify(body),
  });
  expect(res.status, res.status === 200 ? '' : await res.clone().text()).toBe(200);
  const out: Piece = { text: '', lastId: null, ids: [], errors: [], done: false };
  let pieces = 0;
  await readSse(res, ({ event, data, id }) => {
    if (ctl.signal.aborted) return; // cut: what came after is not the client's
    if (id !== undefined) out.lastId = id;
    if (event === 'error') return void out.errors.push(data);
    if (data === '[DONE]') return void (out.done = true);
    if (!data) return;
    const c = JSON.parse(data);
    out.ids.push(c.id);
    const piece = c.choices?.[0]?.text ?? '';
    out.text += piece;
    if (!piece) return;
    pieces++;
    opts.onPiece?.(pieces);
    if (pieces === opts.cut) ctl.abort();
  }).catch(() => undefined); // broken off: what came so far is the client's
  return out;
}

/** A streamed greedy completion of `maxTokens`, `onPiece` told how many text pieces came so far. */
function streamed(base: string, maxTokens: number, onPiece: (pieces: number) => void): Promise<Piece> {
  return streamPiece(base, { model: 'stories260K', prompt: 'Once upon a time', max_tokens: maxTokens, temperature: 0, stream: true }, { onPiece });
}

/** A resume request with `lastEventId`, refused: its status and error code. */
async function refusedResume(base: string, body: Record<string, unknown>, lastEventId: string): Promise<[number, string]> {
  const res = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json', 'last-event-id': lastEventId }, body: JSON.stringify(body) });
  return [res.status, ((await res.json()) as any).error?.code];
}

function expectStoriesText(text: string): void {
  expect(text.length).toBeGreaterThan(40);
  expect(STORIES_CONTINUATION_PREFIX.startsWith(text) || text.startsWith(STORIES_CONTINUATION_PREFIX), text).toBe(true);
}

describe('the directory in Redis', () => {
  it('a room lease is held by one instance at a time; a stale holder is refused by its epoch', async () => {
    const [x, y] = [await Directory.connect(redisUrl, { prefix: 'unit:' }), await Directory.connect(redisUrl, { prefix: 'unit:' })];
    try {
      const first = await x.acquire('r1', 'inst-x', 300);
      expect(first.instance).toBe('inst-x');
      expect(await y.acquire('r1', 'inst-y', 300)).toEqual(first); // held: y sees x's lease
      await x.publishRoom('r1', first, { route: 1 });
      expect(await y.roomState('r1')).toMatchObject({ route: 1, epoch: first.epoch, instance: 'inst-x' });
      // x renews: still the same epoch
      expect(await x.acquire('r1', 'inst-x', 300)).toEqual(first);
      await new Promise((r) => setTimeout(r, 450)); // x stops renewing; its lease expires
      const second = await y.acquire('r1', 'inst-y', 300);
      expect(second).toEqual({ instance: 'inst-y', epoch: first.epoch + 1 });
      let refused: unknown = null;
      await x.publishRoom('r1', first, { route: 2 }).catch((e) => (refused = e));
      expect(isMeshError(refused) && refused.code === 'STALE_LEASE', String(refused)).toBe(true);
      expect(await y.roomState('r1')).toMatchObject({ route: 1, epoch: first.epoch }); // nothing of x's late write
      expect(await x.release('r1', first)).toBe(false);
      expect(await y.release('r1', second)).toBe(true);
      expect(await x.lease('r1')).toBeNull();
    } finally {
      await x.close();
      await y.close();
    }
  });

  it('a bad or silent Redis is named at start', async () => {
    const silent = await freePort();
    const bad = spawnMesh(['serve', '--port', '0', '--ui', 'off', '--model', model, '--secret', SECRET, '--redis', `redis://127.0.0.1:${silent}`]);
    expect(await bad.exited).not.toBe(0);
    expect(bad.output()).toMatch(/REDIS_UNREACHABLE|Redis at redis:\/\/127\.0\.0\.1:\d+ does not answer/);
    const noSecret = spawnMesh(['serve', '--port', '0', '--ui', 'off', '--model', model, '--redis', redisUrl]);
    expect(await noSecret.exited).toBe(2);
    expect(noSecret.output()).toMatch(/--redis needs --secret/);
  }, 60_000);
});

describe('two instances share a room', () => {
  let a: Instance;
  let b: Instance;
  let lb: TcpBalancer;
  let roomId: string;

  beforeAll(async () => {
    [a, b] = await Promise.all([instance('two:', ['--min-peers', '2']), instance('two:', ['--min-peers', '2'])]);
    lb = await startTcpBalancer([{ host: '127.0.0.1', port: a.port }, { host: '127.0.0.1', port: b.port }]);
    balancers.push(lb);
    roomId = await roomIdOf(a);
    expect(await roomIdOf(b)).toBe(roomId);
  }, 60_000);

  /** The instance killed last comes back on its port (the balancer's backend again). */
  async function revive(): Promise<void> {
    const dead = [a, b].find(exited)!;
    const back = await instance('two:', ['--min-peers', '2'], dead.port);
    if (dead === a) a = back;
    else b = back;
  }

  it('a node through each instance makes one route; completions through A, through B and streamed give llama.cpp\'s tokens', async () => {
    // through the balancer: the first node's socket lands on A, the second's on B
    for (const name of ['n1', 'n2']) await spawnMesh(['node', '--join', `${lb.url}/room/${roomId}#secret=${SECRET}`, '--name', name, '--no-cache']).waitFor(/joined room/);
    expect(lb.accepted[0]).toBeGreaterThan(0);
    expect(lb.accepted[1]).toBeGreaterThan(0);
    const route = await waitReady(a.base, roomId, 2);
    expect((await waitReady(b.base, roomId, 2)).id).toBe(route.id); // B answers for the holder's route
    const holder = await holderOf([a, b]);
    const other = holder === a ? b : a;
    expect((await health(other)).cluster).toMatchObject({ redis: 'ok', holds: 0 });
    expect((await fetch(`${other.base}/v1/health`)).status).toBe(200);
    // the other instance planned nothing of its own
    expect((await getJson(`${other.base}/v1/routes`, SECRET)).body.routes).toEqual([]);
    const peers = (await getJson(`${other.base}/v1/rooms/${roomId}/peers`, SECRET)).body.peers;
    expect(peers.map((p: any) => p.name).sort()).toEqual(['n1', 'n2']);
    for (const base of [a.base, b.base]) expectStoriesText(await complete(base));
    const streamed = await complete(other.base, true);
    expect(streamed).toBe(await complete(holder.base));
  }, 120_000);

  it('the holder killed mid-stream: the room passes to the other instance, the peers rejoin through the balancer, the stream through the survivor goes on with the same tokens', async () => {
    const holder = await holderOf([a, b]);
    const survivor = holder === a ? b : a;
    const before = await complete(survivor.base);
    const reference = await streamed(survivor.base, 160, () => undefined);
    expect(reference.errors).toEqual([]);
    // the same request, the holder killed once the first pieces arrived
    let killed: Promise<number> | null = null;
    const cut = await streamed(survivor.base, 160, (pieces) => {
      if (pieces === 6) killed = holder.proc.kill('SIGKILL');
    });
    expect(killed).not.toBeNull();
    expect(cut.errors).toEqual([]);
    expect(cut.text).toBe(reference.text);
    expect(new Set(cut.ids).size).toBe(1); // one stream, one id, across the two holders
    expect(cut.done).toBe(true);
    await killed;
    // the lease expires, the survivor takes it; both nodes come back through the balancer
    await waitReady(survivor.base, roomId, 2, 60_000);
    expect((await health(survivor)).cluster.holds).toBe(1);
    expect(survivor.proc.output()).toMatch(/cluster: room \S+ held \(epoch [2-9]/);
    expect(await complete(survivor.base)).toBe(before);
    expect(await complete(lb.url)).toBe(before); // the balancer skips the dead instance
  }, 120_000);

  it('a stream cut off at its client resumes at the other instance with Last-Event-ID: the seed the holder chose, the same text; bad resumes are refused by name', async () => {
    await revive();
    const holder = await holderOf([a, b]);
    const other = holder === a ? b : a;
    // sampled with no seed: the holder chooses one and journals it
    const body = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 400, temperature: 0.9, stream: true };
    const cut = await streamPiece(holder.base, body, { cut: 5 });
    expect(cut.done).toBe(false);
    const [id, offset] = cut.lastId!.split(':');
    expect(Number(offset)).toBe(cut.text.length);
    const dir = await Directory.connect(redisUrl, { prefix: 'two:' });
    try {
      const rec = (await dir.journalRead(id!))!;
      expect(rec.text.startsWith(cut.text), rec.text).toBe(true);
      expect(Number.isInteger(rec.seed)).toBe(true);
      expect(await refusedResume(other.base, { ...body, max_tokens: 401 }, cut.lastId!)).toEqual([409, 'RESUME_MISMATCH']);
      expect(await refusedResume(other.base, { ...body, seed: rec.seed + 1 }, cut.lastId!)).toEqual([409, 'RESUME_MISMATCH']);
      // (the holder may still be recording what it generated before it saw the client go: far past that)
      expect(await refusedResume(other.base, body, `${id}:${rec.text.length + 100_000}`)).toEqual([400, 'RESUME_BEYOND']);
      expect(await refusedResume(other.base, body, `cmpl-${'0'.repeat(24)}:0`)).toEqual([404, 'RESUME_UNKNOWN']);
      expect(await refusedResume(other.base, body, 'garbage')).toEqual([400, 'RESUME_BAD_EVENT_ID']);
      const rest = await streamPiece(other.base, body, { lastEventId: cut.lastId! });
      expect(rest.errors).toEqual([]);
      expect(rest.done).toBe(true);
      expect(new Set([...cut.ids, ...rest.ids])).toEqual(new Set([id])); // one stream, one id
      // the uninterrupted run under the seed the holder chose
      const whole = await streamPiece(lb.url, { ...body, seed: rec.seed });
      expect(cut.text + rest.text).toBe(whole.text);
      expect(await dir.journalRead(id!)).toBeNull(); // a stream that ended leaves no record
    } finally {
      await dir.close();
    }
  }, 60_000);

  it('the holder killed while its own client streams: the client reconnects through the balancer with Last-Event-ID and gets the rest, the uninterrupted text', async () => {
    const holder = await holderOf([a, b]);
    const survivor = holder === a ? b : a;
    const body = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 160, temperature: 0, stream: true };
    const reference = await streamPiece(holder.base, body);
    let killed: Promise<number> | null = null;
    const cut = await streamPiece(holder.base, body, { onPiece: (n) => void (n === 6 && (killed = holder.proc.kill('SIGKILL'))) });
    expect(killed).not.toBeNull();
    expect(cut.done).toBe(false);
    expect(cut.text.length).toBeGreaterThan(0);
    await killed;
    // the survivor waits for the room (the lease expires, the nodes rejoin it) and sends the rest
    const rest = await streamPiece(lb.url, body, { lastEventId: cut.lastId! });
    expect(rest.errors).toEqual([]);
    expect(rest.done).toBe(true);
    expect(cut.text + rest.text).toBe(reference.text);
    expect(new Set([...cut.ids, ...rest.ids]).size).toBe(1);
    expect(survivor.proc.output()).toMatch(/stream \S+: resumed at \d+/);
  }, 60_000);

  it('frame-API clients through the balancer: the holder they talk to killed mid-generation, their sessions go on at the next holder with the uninterrupted runs\' tokens, greedy and seeded', async () => {
    await revive();
    const holder = await holderOf([a, b]);
    const survivor = holder === a ? b : a;
    await waitReady(holder.base, roomId, 2);
    lb.pin(holder === a ? 0 : 1); // the clients' sockets go to the holder: it drives their sessions and carries their frames
    const joinUrl = `${lb.url}/room/${roomId}#secret=${SECRET}`;
    // (the seeded session is longer: still generating when the greedy one's step kills the holder)
    const seeded = { sampler: { temperature: 0.9, seed: 7 } };
    const [reference, referenceSeeded] = await Promise.all([frameGenerate(joinUrl, 48), frameGenerate(joinUrl, 96, seeded)]);
    expect(reference.events).toEqual([]);
    let killed: Promise<number> | null = null;
    const [cut, cutSeeded] = await Promise.all([frameGenerate(joinUrl, 48, { onStep: (n) => void (n === 12 && (killed = holder.proc.kill('SIGKILL'))) }), frameGenerate(joinUrl, 96, seeded)]);
    lb.pin(null);
    expect(killed).not.toBeNull();
    await killed;
    expect(cut.tokens).toEqual(reference.tokens);
    expect(cutSeeded.tokens).toEqual(referenceSeeded.tokens);
    expect(cutSeeded.tokens.slice(0, 48)).not.toEqual(reference.tokens); // sampled: its draws had to continue
    // one resume each, on the survivor's route (its own route ids), at the position the client had reached
    const route = await waitReady(survivor.base, roomId, 2);
    for (const run of [cut, cutSeeded]) {
      expect(run.events).toHaveLength(1);
      const resumed = run.events[0] as Extract<TelemetryEvent, { type: 'session_resumed' }>;
      expect(resumed).toMatchObject({ type: 'session_resumed', routeId: route.id });
      expect(resumed.routeId).not.toBe(resumed.previousRouteId);
      expect(resumed.tokensReplayed).toBe(resumed.position);
    }
    expect((cut.events[0] as Extract<TelemetryEvent, { type: 'session_resumed' }>).position).toBeGreaterThanOrEqual(STORIES_PROMPT_TOKENS.length + 11);
  }, 60_000);

  it('no instance comes back: the session gives up within its bound with SESSION_RESUME_FAILED, and nothing hangs', async () => {
    const joined = await joinRoom(`${lb.url}/room/${roomId}#secret=${SECRET}`, undefined, 30_000, { resumeMs: 1_000 });
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 32 });
    const first = await c.prefill(STORIES_PROMPT_TOKENS);
    // a refused frame is the caller's at once, never resumed
    c.position = 99;
    await expect(c.decode(first)).rejects.toMatchObject({ code: 'POSITION_MISMATCH' });
    c.position = STORIES_PROMPT_TOKENS.length;
    await Promise.all([a, b].filter((i) => !exited(i)).map((i) => i.proc.kill('SIGKILL')));
    const t0 = Date.now();
    const err = await c.decode(first).then(() => null, (e: unknown) => e);
    expect(isMeshError(err) && err.code, String(err)).toBe('SESSION_RESUME_FAILED');
    expect((err as Error).message).toMatch(new RegExp(`session ${c.sessionId} \\(at position ${STORIES_PROMPT_TOKENS.length}\\).*no ready route through`));
    expect(Date.now() - t0).toBeLessThan(1_000 + 1_500);
    // the next step is bounded the same way; closing ends at once
    await expect(c.decode(first)).rejects.toMatchObject({ code: 'SESSION_RESUME_FAILED' });
    await c.close().catch(() => undefined);
    await joined.close();
  }, 30_000);
});

/** A generation of `n` tokens over the frame API through `joinUrl` (greedy unless `sampler`), `onStep` told how many tokens came before each decode is sent; the link's telemetry with it. */
async function frameGenerate(joinUrl: string, n: number, opts: { sampler?: SamplerSettings; onStep?: (n: number) => void } = {}): Promise<{ tokens: number[]; events: TelemetryEvent[] }> {
  const events: TelemetryEvent[] = [];
  const joined = await joinRoom(joinUrl, undefined, 30_000, { onEvent: (e) => events.push(e) });
  try {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: STORIES_PROMPT_TOKENS.length + n, ...(opts.sampler ? { sampler: opts.sampler } : {}) });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS)];
    while (tokens.length < n) {
      const step = c.decode(tokens.at(-1)!);
      opts.onStep?.(tokens.length);
      tokens.push(await step);
    }
    await c.close();
    return { tokens, events };
  } finally {
    await joined.close();
  }
}

function exited(i: Instance): boolean {
  return i.proc.child.exitCode !== null || i.proc.child.signalCode !== null;
}

describe('a holder frozen past its lease', () => {
  it('kill -STOP: the other instance takes the room under a new epoch; resumed, the old holder hands the room off and plans nothing', async () => {
    const [a, b] = await Promise.all([instance('stop:', ['--min-peers', '2']), instance('stop:', ['--min-peers', '2'])]);
    const lb = await startTcpBalancer([{ host: '127.0.0.1', port: a.port }, { host: '127.0.0.1', port: b.port }]);
    balancers.push(lb);
    const roomId = await roomIdOf(a);
    for (const name of ['s1', 's2']) await spawnMesh(['node', '--join', `${lb.url}/room/${roomId}#secret=${SECRET}`, '--name', name, '--no-cache']).waitFor(/joined room/);
    await waitReady(a.base, roomId, 2);
    const holder = await holderOf([a, b]);
    const other = holder === a ? b : a;
    const before = await complete(other.base);
    const dir = await Directory.connect(redisUrl, { prefix: 'stop:' });
    try {
      const first = (await dir.lease(roomId))!;
      holder.proc.child.kill('SIGSTOP');
      // the lease lapses; the other instance takes it; the nodes hear nothing from the frozen one and rejoin
      await waitReady(other.base, roomId, 2, 60_000);
      const second = (await dir.lease(roomId))!;
      expect(second.epoch).toBeGreaterThan(first.epoch);
      expect(second.instance).not.toBe(first.instance);
      expect(await complete(other.base)).toBe(before);
      holder.proc.child.kill('SIGCONT');
      await holder.proc.waitFor(/cluster: room \S+ lost/, 20_000);
      expect((await health(holder)).cluster.holds).toBe(0);
      // the room's published state is still the new holder's
      expect(await dir.roomState(roomId)).toMatchObject({ epoch: second.epoch, instance: second.instance });
      expect(await complete(holder.base)).toBe(before); // the resumed instance passes requests on
    } finally {
      await dir.close();
    }
  }, 150_000);
});

describe('rooms spread over the instances', () => {
  it('an idle room held by the first instance moves to the one it prefers once that one is up; a room with peers stays', async () => {
    const a = await instance('spread:', ['--min-peers', '1']);
    await holderOf([a]);
    const b = await instance('spread:', ['--min-peers', '1']);
    const roomId = await roomIdOf(a);
    const ids = [(await health(a)).cluster.instance, (await health(b)).cluster.instance];
    const preferred = preferredInstance(roomId, ids) === ids[0] ? a : b;
    const deadline = Date.now() + 20_000;
    while ((await health(preferred)).cluster.holds !== 1) {
      expect(Date.now() < deadline, 'the idle room reached the instance it prefers').toBe(true);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect((await health(preferred === a ? b : a)).cluster.holds).toBe(0);
    // with a peer in it, the room stays where it is while a third instance comes and goes
    await spawnMesh(['node', '--join', `${preferred.base}/room/${roomId}#secret=${SECRET}`, '--name', 'stay', '--no-cache']).waitFor(/joined room/);
    const c = await instance('spread:', ['--min-peers', '1']);
    await new Promise((r) => setTimeout(r, 2 * LEASE_MS));
    expect((await health(preferred)).cluster.holds).toBe(1);
    expect((await health(c)).cluster.holds).toBe(0);
    expectStoriesText(await complete(c.base));
  }, 120_000);
});

describe('planner races', () => {
  it('four nodes joining two instances at once get one plan: every layer once, every peer at most once', async () => {
    const [a, b] = await Promise.all([instance('race:', ['--min-peers', '4', '--plan-delay', '100']), instance('race:', ['--min-peers', '4', '--plan-delay', '100'])]);
    const roomId = await roomIdOf(a);
    const joins = ['r1', 'r2', 'r3', 'r4'].map((name, k) => spawnMesh(['node', '--join', `${(k % 2 ? b : a).base}/room/${roomId}#secret=${SECRET}`, '--name', name, '--no-cache']).waitFor(/joined room/));
    await Promise.all(joins);
    const route = await waitReady(a.base, roomId, 4, 90_000);
    const stages = route.stages as Array<{ peerId: string; shard: { start: number; end: number } }>;
    expect(new Set(stages.map((s) => s.peerId)).size).toBe(stages.length);
    let at = 0;
    for (const s of stages) {
      expect(s.shard.start).toBe(at);
      at = s.shard.end;
    }
    expect(at).toBe(5);
    // one instance planned; the other has no route, and the published state is the holder's, under the current epoch
    const holder = await holderOf([a, b]);
    const other = holder === a ? b : a;
    expect((await getJson(`${other.base}/v1/routes`, SECRET)).body.routes).toEqual([]);
    expect((await getJson(`${holder.base}/v1/routes`, SECRET)).body.routes.filter((r: any) => r.status !== 'closed')).toHaveLength(1);
    const dir = await Directory.connect(redisUrl, { prefix: 'race:' });
    try {
      const lease = await dir.lease(roomId);
      const state = await dir.roomState<{ route: { id: number; stages: unknown[] } }>(roomId);
      expect(state).toMatchObject({ epoch: lease!.epoch, instance: lease!.instance, route: { id: route.id } });
      expect(state!.route.stages).toHaveLength(4);
    } finally {
      await dir.close();
    }
    expectStoriesText(await complete(other.base));
  }, 150_000);
});
