// A stopped stage that comes back after its repair (real serve and node processes over real
// sockets): the middle stage of a 3-stage CPU route is SIGSTOP'd mid-stream until the server
// declares it lost — the overdue step's status probe finds it, long before its heartbeat
// would — and a warm spare has taken its stage, then SIGCONT'd while the stream goes on. The revived process still holds frames buffered in its sockets from before; whatever of
// them it computes and sends on to its old next stage is refused there (NOT_UPSTREAM: the next
// stage's upstream is the spare now), so the streamed text is exactly the uninterrupted run's.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { currentRoute, getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';
import type { Streamed } from './support/sse.ts';

const STAGES = ['0-2', '2-3', '3-5'];
let serve: ServeInfo;
const nodes = new Map<string, MeshProcess>();
let reference = '';

function spawnNode(layers: string, name: string): MeshProcess {
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--layers', layers, '--name', name]);
  nodes.set(name, proc);
  return proc;
}

const route = (): Promise<any> => currentRoute(serve);

async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await probe();
    if (got) return got;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms\n${serve.proc.output().slice(-3000)}`);
    await new Promise((res) => setTimeout(res, 50));
  }
}

const SEEDED = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 400, temperature: 0.9, top_p: 0.95, seed: 4321 };

function stream(onChunk: (n: number) => void = () => undefined): Promise<Streamed> {
  return streamCompletion(serve.base, serve.secret, SEEDED, onChunk);
}

/** A node's frame-server status (its listen address's GET /v1/status). */
async function nodeStatus(listen: string): Promise<any> {
  return (await getJson(`${listen.replace(/^ws/, 'http').replace(/\/v1\/frames$/, '')}/v1/status`, serve.secret)).body;
}

beforeAll(async () => {
  // a heartbeat timeout too long to matter: the step deadline's status probe finds the stopped stage
  serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--heartbeat', '500', '--heartbeat-timeout', '20000', '--repair-timeout', '8000']);
  for (const [i, layers] of STAGES.entries()) await spawnNode(layers, `s${i}`).waitFor(/joined room/);
  spawnNode(STAGES[1]!, 'spare');
  await until('a ready route with a ready spare for stage 1', async () => {
    const r = await route();
    return r?.status === 'ready' && r.spares.some((s: any) => s.stage === 1 && s.status === 'ready') && r;
  });
  const out = await stream();
  expect(out.errors).toEqual([]);
  expect(out.chunks).toBeGreaterThan(100);
  reference = out.text;
}, 180_000);

afterAll(async () => {
  await killAll();
});

describe('a stopped stage revived after its repair', () => {
  it('SIGSTOP until repaired, SIGCONT while the stream goes on: the seeded text equals the uninterrupted run, the revived peer’s frames are refused downstream', async () => {
    const before = await route();
    const [, victim, last] = before.stages as Array<{ peerId: string; listen: string }>;
    const proc = nodes.get(victim!.peerId.split('-')[0]!)!;
    let revived: Promise<{ chunks: number; replacement: string }> | null = null;
    let chunks = 0;
    const out = await stream((n) => {
      chunks = n;
      if (n !== 20) return;
      proc.child.kill('SIGSTOP');
      revived = (async () => {
        // declared lost and repaired: stage 1 has a new peer and the route is ready again
        const r = await until('the repair of stage 1', async () => {
          const now = await route();
          return now?.status === 'ready' && now.stages[1].peerId !== victim!.peerId && now;
        }, 30_000);
        proc.child.kill('SIGCONT');
        return { chunks, replacement: r.stages[1].peerId as string };
      })();
    });
    expect(revived, `the fault never fired: only ${out.chunks} chunks`).not.toBeNull();
    const { chunks: atRevival, replacement } = await revived!;
    expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
    expect(out.text).toBe(reference);
    expect(out.events.find((e) => e.type === 'stage_lost')?.cause).toMatch(/stalled: no answer to a status probe/);
    const repaired = out.events.filter((e) => e.type === 'route_repaired');
    expect(repaired.length, JSON.stringify(out.events.map((e) => e.type))).toBeGreaterThanOrEqual(1);
    // the revived process woke while tokens were still streaming
    expect(atRevival).toBeLessThan(out.chunks);
    // the last stage takes hidden states only from the replacement now
    const status = await nodeStatus(last!.listen);
    expect(status.fence).toMatchObject({ upstream: replacement, rewired: true });
    // what the revived process held (the step it was handed as it stopped) reached the last
    // stage and was turned away there, naming the sender and the expected upstream
    expect(status.fence.refused, JSON.stringify(status.fence)).toBeGreaterThanOrEqual(1);
    expect(status.fence.lastRefused).toMatchObject({ from: victim!.peerId, expected: replacement, type: 'Hidden' });
    const lastProc = nodes.get(last!.peerId.split('-')[0]!)!;
    expect(lastProc.output()).toContain(`from peer ${victim!.peerId} refused: this stage's upstream is ${replacement} since a repair`);
  }, 120_000);
});
