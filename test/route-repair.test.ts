// A session survives a lost, stalled or leaving stage (real serve and node processes over real
// sockets): the route gets a new peer for the stage — a warm spare holding that shard — the
// session is rebuilt on it without recomputing the other stages, and the streamed text is the
// text of an uninterrupted run, for greedy and for seeded sampling, with no error on the stream.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';
import type { Streamed } from './support/sse.ts';

/** stages of the 3-stage route and the --layers each peer asks for */
const STAGES = ['0-2', '2-3', '3-5'];
let serve: ServeInfo;
/** name prefix → process */
const nodes = new Map<string, MeshProcess>();
let spawned = 0;

function spawnNode(layers: string): { name: string; proc: MeshProcess } {
  const name = `n${spawned++}`;
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--layers', layers, '--name', name]);
  nodes.set(name, proc);
  return { name, proc };
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  if (!room.route) return null;
  return (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body;
}

/** Polls until the route is ready with a ready spare for every stage. */
async function readyWithSpares(): Promise<any> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await route();
    const covered = r && r.status === 'ready' && r.stages.every((st: any) => r.spares.some((s: any) => s.stage === st.stage && s.status === 'ready'));
    if (covered) return r;
    if (Date.now() > deadline) throw new Error(`no ready route with spares: ${JSON.stringify(r)}\n${serve.proc.output().slice(-3000)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

/** The process serving stage `stage` now. */
async function stageProcess(stage: number): Promise<{ name: string; proc: MeshProcess; peerId: string }> {
  const r = await route();
  const peerId: string = r.stages[stage].peerId;
  const name = peerId.split('-')[0]!;
  return { name, proc: nodes.get(name)!, peerId };
}

/** A streamed /v1/completions of the test prompt; `onChunk(n)` is called after the n-th text chunk. */
function stream(sampling: Record<string, unknown>, onChunk: (n: number) => void = () => undefined): Promise<Streamed> {
  return streamCompletion(serve.base, serve.secret, { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 300, ...sampling }, onChunk);
}

const GREEDY = { temperature: 0 };
const SEEDED = { temperature: 0.9, top_p: 0.95, seed: 1234 };
const reference = new Map<object, string>();

/** Streams with a fault injected after `after` chunks; returns what the client saw. */
async function withFault(sampling: object, after: number, fault: () => Promise<void>): Promise<Streamed> {
  let fired: Promise<void> | null = null;
  const out = await stream(sampling as Record<string, unknown>, (n) => {
    if (n === after) fired = fault();
  });
  expect(fired, `the fault never fired: only ${out.chunks} chunks`).not.toBeNull();
  await fired;
  return out;
}

function expectRepaired(out: Streamed, sampling: object, stage: number): void {
  expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
  expect(out.text).toBe(reference.get(sampling));
  const repaired = out.events.filter((e) => e.type === 'route_repaired');
  expect(repaired.length, JSON.stringify(out.events.map((e) => e.type))).toBeGreaterThanOrEqual(1);
  expect(repaired[0].stages).toContain(stage);
  expect(repaired[0].tokensReplayed).toBeGreaterThan(0);
  // a replaced stage's output is bit-identical to the lost one's (same backend, same chunking)
  if (repaired[0].divergenceChecked) expect(repaired[0].firstDivergentPosition).toBeNull();
}

beforeAll(async () => {
  serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '8000', '--step-timeout', '30000']); // the heartbeat finds a stopped stage here; the step-deadline probe has route-repair-revived.test.ts
  for (const layers of STAGES) await spawnNode(layers).proc.waitFor(/joined room/);
  for (const layers of STAGES) spawnNode(layers); // one spare per stage
  await readyWithSpares();
  for (const s of [GREEDY, SEEDED]) {
    const out = await stream(s);
    expect(out.errors).toEqual([]);
    expect(out.chunks).toBeGreaterThan(60);
    reference.set(s, out.text);
  }
}, 180_000);

afterAll(async () => {
  await killAll();
});

describe('a stage lost mid-stream, with a warm spare', () => {
  for (const [stage, label] of [[0, 'first'], [1, 'middle'], [2, 'last']] as const) {
    for (const [sampling, how] of [[GREEDY, 'greedy'], [SEEDED, 'seeded']] as const) {
      it(`kill -9 of the ${label} stage: the ${how} text equals the uninterrupted run`, async () => {
        await readyWithSpares();
        const victim = await stageProcess(stage);
        const out = await withFault(sampling, 20, async () => {
          await victim.proc.kill('SIGKILL');
        });
        expectRepaired(out, sampling, stage);
        spawnNode(STAGES[stage]!); // a new spare for the next test
      }, 90_000);
    }
  }
});

describe('a stopped stage', () => {
  it('kill -STOP: detected by its heartbeat, repaired, the same text', async () => {
    await readyWithSpares();
    const victim = await stageProcess(1);
    const t0 = Date.now();
    let stoppedAt = 0;
    const out = await withFault(GREEDY, 20, async () => {
      stoppedAt = Date.now();
      victim.proc.child.kill('SIGSTOP');
    });
    expectRepaired(out, GREEDY, 1);
    const lost = out.events.find((e) => e.type === 'stage_lost');
    expect(lost.cause).toMatch(/heartbeat/);
    // the stream went on within the heartbeat timeout plus the repair, well under 10 s
    expect(Date.now() - t0).toBeLessThan(60_000);
    expect(stoppedAt).toBeGreaterThan(0);
    await victim.proc.kill('SIGKILL');
    spawnNode(STAGES[1]!);
  }, 90_000);

  it("serve's log names each session's start, repairs and end, not every step", () => {
    const lines = serve.proc.output().split('\n').filter((l) => /^session [0-9a-f]+: /.test(l));
    // streams of 300 tokens, the ones above repaired: a line a step would be hundreds a stream
    expect(lines.filter((l) => /: repaired, (idle|prefilling|decoding)$/.test(l)).length, lines.join('\n')).toBeGreaterThanOrEqual(1);
    expect(lines.filter((l) => /: (idle|prefilling|decoding)$/.test(l))).toEqual([]);
    // (completions of one prompt continue one kept session: the prefix cache)
    expect(lines.filter((l) => /: opening$/.test(l)).length).toBeGreaterThanOrEqual(1);
  });
});

describe('a graceful leave', () => {
  it('SIGTERM of a stage mid-stream: no error, no repair wait for the client, the same text', async () => {
    await readyWithSpares();
    const victim = await stageProcess(2);
    const out = await withFault(SEEDED, 20, async () => {
      victim.proc.child.kill('SIGTERM');
    });
    expectRepaired(out, SEEDED, 2);
    expect(out.events.some((e) => e.type === 'stage_lost' && /gracefully/.test(e.cause))).toBe(true);
    expect(await victim.proc.exited).toBe(0);
    expect(victim.proc.output()).toMatch(/stage handed over/);
    spawnNode(STAGES[2]!);
  }, 90_000);
});

describe('five faults on one generation', () => {
  it('kill, stop, terminate, kill, kill — spares rejoining between them — the same text', async () => {
    await readyWithSpares();
    const plan: Array<[number, 'SIGKILL' | 'SIGSTOP' | 'SIGTERM']> = [[0, 'SIGKILL'], [2, 'SIGSTOP'], [1, 'SIGTERM'], [2, 'SIGKILL'], [0, 'SIGKILL']];
    let next = 0;
    let armed = true;
    let busy: Promise<void> = Promise.resolve();
    const victims: MeshProcess[] = [];
    const out = await stream(GREEDY, (n) => {
      // one fault at a time: the next waits until the route serves that stage on a new peer
      // (with fast decoding two faults could otherwise land inside one repair)
      if (next >= plan.length || !armed || n < 12 + next * 14) return;
      armed = false;
      const [stage, signal] = plan[next++]!;
      busy = busy.then(async () => {
        const v = await stageProcess(stage);
        victims.push(v.proc);
        v.proc.child.kill(signal);
        spawnNode(STAGES[stage]!); // the spare for the next fault joins meanwhile
        for (const deadline = Date.now() + 30_000; Date.now() < deadline; await new Promise((res) => setTimeout(res, 50))) {
          const r = await route();
          if (r?.status === 'ready' && r.stages[stage].peerId !== v.peerId) break;
        }
        armed = true;
      });
    });
    await busy;
    expect(next).toBe(plan.length);
    expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
    expect(out.text).toBe(reference.get(GREEDY));
    expect(out.events.filter((e) => e.type === 'route_repaired').length).toBeGreaterThanOrEqual(plan.length);
    for (const v of victims) await v.kill('SIGKILL');
  }, 180_000);
});

describe('no spare', () => {
  it('a lost stage with no replacement: a clear error within the repair timeout, KV freed on the survivors', async () => {
    await readyWithSpares();
    // take every spare away first (graceful: they hold no stage), then lose a stage
    const r = await route();
    for (const s of r.spares) {
      const name = s.peerId.split('-')[0]!;
      await nodes.get(name)!.kill('SIGTERM');
    }
    const victim = await stageProcess(1);
    const t0 = Date.now();
    const out = await withFault(GREEDY, 10, async () => {
      await victim.proc.kill('SIGKILL');
    });
    expect(out.errors).toHaveLength(1);
    expect(out.errors[0].error.code).toBe('STAGE_LOST');
    expect(out.errors[0].error.stage).toBe(1);
    expect(out.errors[0].error.message).toContain(victim.peerId);
    expect(out.errors[0].error.message).toMatch(/no replacement/);
    expect(Date.now() - t0).toBeLessThan(8_000 + 10_000);
    // the survivors hold no KV for any session: their frame servers list no open session
    const after = await route();
    for (const st of after.stages) {
      if (st.stage === 1) continue;
      const http = st.peer?.httpUrl as string | undefined;
      expect(http, JSON.stringify(st)).toBeTruthy();
      const status = await (await fetch(`${http}/v1/status`, { headers: { authorization: `Bearer ${serve.secret}` } })).json();
      expect(status.sessions ?? [], JSON.stringify(status)).toEqual([]);
    }
  }, 90_000);
});
