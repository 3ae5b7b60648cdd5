// Spares follow the route (real serve and node processes, real sockets): a peer started with
// --layers is a spare, or a replacement, only for a stage with exactly that range; when the route
// changes (a lost stage nobody may take, so the room plans a new route) every spare's standby is
// re-targeted to a stage of the new route, and stale standbys are dropped; then a repair that
// consumes one spare, a new spare joining, and a loss at another stage are each repaired warm
// with the text of an uninterrupted run.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';

let serve: ServeInfo;
const nodes = new Map<string, MeshProcess>();

async function spawnNode(name: string, layers: string): Promise<MeshProcess> {
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--no-cache', '--layers', layers, '--name', name]);
  nodes.set(name, proc);
  await proc.waitFor(/joined room/);
  return proc;
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  return room.route ? (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body : null;
}

/** Polls until the route is ready and `ok` holds. */
async function until(what: string, ok: (r: any) => boolean, ms = 60_000): Promise<any> {
  const deadline = Date.now() + ms;
  for (;;) {
    const r = await route();
    if (r?.status === 'ready' && ok(r)) return r;
    if (Date.now() > deadline) throw new Error(`${what}: ${JSON.stringify(r)}\n${serve.proc.output().slice(-4000)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

const layersOf = (r: any): string[] => r.stages.map((st: any) => `${st.shard.start}-${st.shard.end}`);
const namesOf = (r: any): string[] => r.stages.map((st: any) => String(st.peerId).split('-')[0]);
const spareOf = (r: any, name: string): any => r.spares.find((s: any) => String(s.peerId).startsWith(`${name}-`));
const readySpare = (name: string, stage: number) => (r: any): boolean => spareOf(r, name)?.status === 'ready' && spareOf(r, name)?.stage === stage;

/** Every spare's standby is a stage of the route as it stands. */
function expectSparesMatch(r: any): void {
  for (const s of r.spares) {
    expect(s.routeId, JSON.stringify(r.spares)).toBe(r.id);
    expect(r.stages[s.stage]?.shard, JSON.stringify(r.spares)).toEqual(s.shard);
  }
}

const GREEDY = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 200, temperature: 0 };

beforeAll(async () => {
  serve = await spawnServe(await stories260K(), ['--min-peers', '2', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '3000']);
}, 60_000);

afterAll(async () => {
  await killAll();
});

describe('standby shards after route changes', () => {
  it('--layers is kept, stale standbys are re-targeted, and repairs after a re-plan are warm with the same text', async () => {
    await spawnNode('a', '0-3');
    await spawnNode('b', '3-5');
    await until('route a, b', (r) => namesOf(r).join() === 'a,b');
    // s and c ask for ranges no stage of this route has; t for stage 1's
    await spawnNode('s', '0-2');
    await spawnNode('c', '2-5');
    await spawnNode('t', '3-5');
    let r = await until('t a ready spare for stage 1', readySpare('t', 1));
    expect(spareOf(r, 's'), JSON.stringify(r.spares)).toBeUndefined();
    expect(spareOf(r, 'c'), JSON.stringify(r.spares)).toBeUndefined();
    expectSparesMatch(r);

    // stage 0 (0-3) lost and nobody may take it: the repair gives up, the room plans s + c
    await nodes.get('a')!.kill('SIGKILL');
    r = await until('a new route s, c', (x) => namesOf(x).join() === 's,c');
    expect(layersOf(r)).toEqual(['0-2', '2-5']);
    // b and t (3-5) can take no stage of it: t's standby for the old route's stage 1 is gone
    expect(r.spares, JSON.stringify(r.spares)).toEqual([]);

    await spawnNode('u', '2-5');
    await spawnNode('v', '0-2');
    r = await until('u and v ready spares', (x) => readySpare('u', 1)(x) && readySpare('v', 0)(x));
    expectSparesMatch(r);
    const reference = await streamCompletion(serve.base, serve.secret, GREEDY);
    expect(reference.errors).toEqual([]);
    expect(reference.chunks).toBeGreaterThan(40);

    // a repair consuming u, a new spare w joining, then a loss at the other stage
    for (const [victim, stage, spare] of [['c', 1, 'u'], ['s', 0, 'v']] as const) {
      let fired: Promise<number> | null = null;
      const out = await streamCompletion(serve.base, serve.secret, GREEDY, (n) => {
        if (n === 15) fired = nodes.get(victim)!.kill('SIGKILL');
      });
      expect(fired).not.toBeNull();
      await fired;
      expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
      expect(out.text).toBe(reference.text);
      const repaired = out.events.filter((e) => e.type === 'route_repaired');
      expect(repaired.length, JSON.stringify(out.events.map((e) => e.type))).toBeGreaterThanOrEqual(1);
      expect(repaired[0].stages).toEqual([stage]);
      expect(serve.proc.output()).toMatch(new RegExp(`stage ${stage} goes to ${spare}-\\S+ \\(warm spare\\)`));
      r = await until(`${spare} serving stage ${stage}`, (x) => namesOf(x)[stage] === spare);
      expectSparesMatch(r);
      if (victim === 'c') {
        await spawnNode('w', '2-5');
        r = await until('w a ready spare for stage 1', readySpare('w', 1));
        expectSparesMatch(r);
      }
    }
  }, 180_000);
});
