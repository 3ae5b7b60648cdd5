// Session repair with PyTorch peers (peers/torch/, `gguf-mesh node --backend torch`) in the
// route, real serve and node processes over real sockets, as test/route-repair.test.ts does it
// for CPU nodes. A 3-stage route torch → cpu → torch with a warm spare per stage:
//   - the CPU middle stage is killed: the torch stage before it is rewound and resends the
//     hidden states it logged to a torch standby spare (Replay frames), the torch stage after it
//     is rewound — the text equals the uninterrupted run;
//   - the torch first stage is killed: a CPU spare replays the token history;
//   - the torch last stage is killed with seeded sampling: a torch spare skips the draws made;
//   - a torch stage gets SIGTERM: it hands its stage over, no error reaches the client, it exits 0;
//   - the torch last stage is stopped (SIGSTOP): its heartbeat stops, it is lost, and a CPU spare
//     gets the torch stage before it resending its log in merged frames.
// Every spare here that is a torch peer loaded its standby shard ahead of time.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { STORIES_CONTINUATION_PREFIX, stories260K } from './support/models.ts';
import { streamCompletion } from './support/sse.ts';
import type { Streamed } from './support/sse.ts';

const STAGES = ['0-2', '2-3', '3-5'];
const GREEDY = { temperature: 0 };
const SEEDED = { temperature: 0.9, top_p: 0.95, seed: 4321 };
let serve: ServeInfo;
const nodes = new Map<string, { proc: MeshProcess; backend: 'torch' | 'cpu' }>();
let spawned = 0;

function spawnNode(backend: 'torch' | 'cpu', layers: string): { name: string; proc: MeshProcess } {
  const name = `${backend === 'torch' ? 't' : 'c'}${spawned++}`;
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', backend, '--memory', '1GiB', '--layers', layers, '--name', name]);
  nodes.set(name, { proc, backend });
  return { name, proc };
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  if (!room.route) return null;
  return (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body;
}

/** Polls until the route is ready with a ready spare for each of `stages` (default: every stage). */
async function readyWithSpares(stages?: number[]): Promise<any> {
  const deadline = Date.now() + 90_000;
  for (;;) {
    const r = await route();
    const want = (st: any): boolean => !stages || stages.includes(st.stage);
    if (r && r.status === 'ready' && r.stages.filter(want).every((st: any) => r.spares.some((s: any) => s.stage === st.stage && s.status === 'ready'))) return r;
    if (Date.now() > deadline) throw new Error(`no ready route with spares: ${JSON.stringify(r)}\n${serve.proc.output().slice(-3000)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

/** The node serving `stage` now, and the one that is its spare. */
async function stageAndSpare(stage: number): Promise<{ victim: { name: string; proc: MeshProcess; backend: string; peerId: string }; spare: { name: string; backend: string } }> {
  const r = await readyWithSpares([stage]);
  const peerId: string = r.stages[stage].peerId;
  const name = peerId.split('-')[0]!;
  const spareName = (r.spares.find((s: any) => s.stage === stage).peerId as string).split('-')[0]!;
  return { victim: { name, peerId, ...nodes.get(name)! }, spare: { name: spareName, backend: nodes.get(spareName)!.backend } };
}

function stream(sampling: object, maxTokens: number, onChunk: (n: number) => void = () => undefined): Promise<Streamed> {
  return streamCompletion(serve.base, serve.secret, { model: 'stories260K', prompt: 'Once upon a time', max_tokens: maxTokens, ...sampling }, onChunk);
}

/** The uninterrupted run on the route as it is now. */
async function reference(sampling: object, maxTokens: number): Promise<string> {
  const out = await stream(sampling, maxTokens);
  expect(out.errors).toEqual([]);
  expect(out.chunks).toBeGreaterThan(40);
  return out.text;
}

/** Streams with `fault` fired after `after` text chunks. */
async function withFault(sampling: object, maxTokens: number, after: number, fault: () => void | Promise<unknown>): Promise<Streamed> {
  let fired: Promise<unknown> | null = null;
  const out = await stream(sampling, maxTokens, (n) => {
    if (n === after) fired = Promise.resolve(fault());
  });
  expect(fired, `the fault never fired: only ${out.chunks} chunks`).not.toBeNull();
  await fired;
  return out;
}

function repairedEvent(out: Streamed, stage: number): any {
  expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
  const repaired = out.events.filter((e) => e.type === 'route_repaired');
  expect(repaired.length, JSON.stringify(out.events.map((e) => e.type))).toBeGreaterThanOrEqual(1);
  expect(repaired[0].stages).toContain(stage);
  expect(repaired[0].tokensReplayed).toBeGreaterThan(0);
  return repaired[0];
}

/** The route's backend per stage, from its peers. */
async function backends(): Promise<string[]> {
  return (await route()).stages.map((st: any) => st.peer.backend);
}

let greedyText: string;

beforeAll(async () => {
  serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '20000', '--step-timeout', '30000']); // the heartbeat finds a stopped stage here; the step-deadline probe has route-repair-revived.test.ts
  // the route: torch → cpu → torch (one at a time, so the planner sees each one's --layers)
  for (const [backend, layers] of [['torch', STAGES[0]], ['cpu', STAGES[1]], ['torch', STAGES[2]]] as const) await spawnNode(backend, layers!).proc.waitFor(/joined room/, 120_000);
  // the spares: a CPU node for the first stage, torch peers for the other two
  spawnNode('cpu', STAGES[0]!);
  spawnNode('torch', STAGES[1]!);
  spawnNode('torch', STAGES[2]!);
  await readyWithSpares();
  expect(await backends()).toEqual(['torch', 'cpu', 'torch']);
  greedyText = await reference(GREEDY, 120);
  // llama.cpp's greedy continuation of this prompt (test/support/models.ts)
  expect(greedyText.startsWith(STORIES_CONTINUATION_PREFIX), greedyText).toBe(true);
}, 240_000);

afterAll(async () => {
  await killAll();
});

describe('repairs around and of PyTorch stages', () => {
  it('kill -9 of the CPU middle stage: the torch stage before it resends its logged hidden states to a torch standby spare, the torch last stage is rewound — the same greedy text', async () => {
    const { victim, spare } = await stageAndSpare(1);
    expect([victim.backend, spare.backend]).toEqual(['cpu', 'torch']);
    const out = await withFault(GREEDY, 120, 15, () => victim.proc.kill('SIGKILL'));
    const ev = repairedEvent(out, 1);
    expect(out.text).toBe(greedyText);
    // hidden states went peer to peer from the torch stage 0 (its Resend reply's byte count)
    expect(ev.bytesReplayed).toBeGreaterThan(0);
    // the torch stage after the new one answered its received-row hashes; the new torch stage its sent ones
    expect(ev.divergenceChecked).toBe(true);
    console.log(`cpu → torch middle stage: first divergent position ${ev.firstDivergentPosition}, ${ev.tokensReplayed} tokens replayed in ${ev.repairMs} ms`);
    expect(serve.proc.output()).toMatch(new RegExp(`stage 1 goes to ${spare.name}-\\S+ \\(warm spare\\)`));
    expect(await backends()).toEqual(['torch', 'torch', 'torch']);
    const took = nodes.get(spare.name)!.proc.output();
    expect(took).toMatch(/standby: layers 2-3 loaded/);
    expect(took).toMatch(/ready \(from the standby shard/);
  }, 120_000);

  it('kill -9 of the torch first stage: a CPU spare replays the token history, the torch stages after it are rewound — the same greedy text', async () => {
    const { victim, spare } = await stageAndSpare(0);
    expect([victim.backend, spare.backend]).toEqual(['torch', 'cpu']);
    const before = await reference(GREEDY, 120);
    expect(before).toBe(greedyText);
    const out = await withFault(GREEDY, 120, 25, () => victim.proc.kill('SIGKILL'));
    const ev = repairedEvent(out, 0);
    expect(out.text).toBe(greedyText);
    expect(ev.divergenceChecked).toBe(true);
    // torch and the CPU reference round differently: the check reports where their rows first differ
    expect(ev.firstDivergentPosition === null || Number.isInteger(ev.firstDivergentPosition)).toBe(true);
    console.log(`torch → cpu first stage: first divergent position ${ev.firstDivergentPosition}, ${ev.tokensReplayed} tokens replayed in ${ev.repairMs} ms`);
    expect(await backends()).toEqual(['cpu', 'torch', 'torch']);
    spawnNode('torch', STAGES[1]!); // the spare for the leave below
  }, 120_000);

  it('kill -9 of the torch last stage with seeded sampling: a torch standby spare skips the draws already made — the same seeded text', async () => {
    const { victim, spare } = await stageAndSpare(2);
    expect([victim.backend, spare.backend]).toEqual(['torch', 'torch']);
    const seeded = await reference(SEEDED, 120);
    const out = await withFault(SEEDED, 120, 20, () => victim.proc.kill('SIGKILL'));
    const ev = repairedEvent(out, 2);
    expect(out.text).toBe(seeded);
    expect(ev.divergenceChecked).toBe(false); // a new last stage is not checked
    expect(await backends()).toEqual(['cpu', 'torch', 'torch']);
  }, 120_000);

  it('SIGTERM of a torch stage mid-stream: it hands the stage to a torch spare, no error reaches the client, the same seeded text, exit 0', async () => {
    const { victim, spare } = await stageAndSpare(1);
    expect([victim.backend, spare.backend]).toEqual(['torch', 'torch']);
    const seeded = await reference(SEEDED, 120);
    const out = await withFault(SEEDED, 120, 20, () => {
      victim.proc.child.kill('SIGTERM');
    });
    repairedEvent(out, 1);
    expect(out.text).toBe(seeded);
    expect(out.events.some((e) => e.type === 'stage_lost' && /gracefully/.test(e.cause))).toBe(true);
    expect(await victim.proc.exited).toBe(0);
    expect(victim.proc.output()).toMatch(/stage handed over/);
    expect((await route()).stages[1].peerId.split('-')[0]).toBe(spare.name);
    expect(nodes.get(spare.name)!.proc.output()).toMatch(/ready \(from the standby shard/);
    spawnNode('cpu', STAGES[2]!); // the spare for the stop below
  }, 120_000);

  it('kill -STOP of the torch last stage: its heartbeat stops, it is lost; a CPU spare gets the torch stage before it resending in merged 256-row frames — the same greedy text', async () => {
    const { victim, spare } = await stageAndSpare(2);
    expect([victim.backend, spare.backend]).toEqual(['torch', 'cpu']);
    // `gguf-mesh node --backend torch` runs the PyTorch peer as its child: stop that one
    const python = Number(readFileSync(`/proc/${victim.proc.child.pid}/task/${victim.proc.child.pid}/children`, 'utf8').trim().split(/\s+/)[0]);
    expect(python).toBeGreaterThan(0);
    const out = await withFault(GREEDY, 120, 20, () => {
      process.kill(python, 'SIGSTOP');
    });
    const ev = repairedEvent(out, 2);
    expect(out.text).toBe(greedyText);
    expect(out.events.find((e) => e.type === 'stage_lost')?.cause).toMatch(/heartbeat/);
    // one 52-byte header per 256 rows of n_embd (64) f16 values: the log went out merged
    expect(ev.bytesReplayed).toBe(52 * Math.ceil(ev.tokensReplayed / 256) + ev.tokensReplayed * 64 * 2);
    // the CPU reference is batch-invariant, so the torch stage merged its logged frames (the prompt chunk and the decode rows) into one
    expect(await backends()).toEqual(['cpu', 'torch', 'cpu']);
    await victim.proc.kill('SIGKILL'); // the stopped child dies with it (PR_SET_PDEATHSIG)
  }, 120_000);

  it('SIGTERM of a torch spare that serves no stage: leave-ok at once, exit 0, no longer a spare', async () => {
    const { name, proc } = spawnNode('torch', STAGES[0]!);
    await readyWithSpares([0]);
    proc.child.kill('SIGTERM');
    expect(await proc.exited).toBe(0);
    expect(proc.output()).toMatch(/stage handed over/);
    const r = await route();
    expect(r.status).toBe('ready');
    expect(r.spares.map((sp: any) => sp.peerId.split('-')[0])).not.toContain(name);
  }, 120_000);
});
