// Two adjacent PyTorch stages lost at once: each gets a torch spare, and the stage before the
// first lost one is rewired while the other replacement may still be loading — the same text.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { stories260K } from './support/models.ts';
import { streamCompletion } from './support/sse.ts';

const STAGES = ['0-2', '2-3', '3-5'];
let serve: ServeInfo;
const procs = new Map<string, MeshProcess>();

function spawnNode(name: string, layers: string, extra: string[] = []): MeshProcess {
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'torch', '--memory', '1GiB', '--layers', layers, '--name', name, ...extra]);
  procs.set(name, proc);
  return proc;
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  return room.route ? (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body : null;
}

beforeAll(async () => {
  serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '30000', '--standby', 'off']);
  for (const [i, layers] of STAGES.entries()) await spawnNode(`t${i}`, layers).waitFor(/joined room/, 120_000);
  for (;;) {
    const r = await route();
    if (r?.status === 'ready') break;
    await new Promise((res) => setTimeout(res, 100));
  }
}, 180_000);

afterAll(async () => {
  await killAll();
});

describe('two torch stages lost at once, cold torch replacements', () => {
  it('the same greedy text', async () => {
    const ref = await streamCompletion(serve.base, serve.secret, { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 100, temperature: 0 });
    expect(ref.errors).toEqual([]);
    // cold spares: with --standby off they load only when they take over
    spawnNode('s1', STAGES[1]!);
    spawnNode('s2', STAGES[2]!);
    await procs.get('s1')!.waitFor(/joined room/, 120_000);
    await procs.get('s2')!.waitFor(/joined room/, 120_000);
    let fired: Promise<unknown> | null = null;
    const out = await streamCompletion(serve.base, serve.secret, { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 100, temperature: 0 }, (n) => {
      if (n === 20) fired = Promise.all([procs.get('t1')!.kill('SIGKILL'), procs.get('t2')!.kill('SIGKILL')]);
    });
    await fired;
    expect(out.errors, JSON.stringify(out.errors) + serve.proc.output().slice(-3000)).toEqual([]);
    expect(out.text).toBe(ref.text);
    const r = await route();
    // a cold replacement is any idle peer that can hold the shard: s1 and s2 may take either stage
    const names = r.stages.map((s: any) => s.peerId.split('-')[0]);
    expect(names[0]).toBe('t0');
    expect(names.slice(1).sort()).toEqual(['s1', 's2']);
    console.log(procs.get('s1')!.output().split('\n').filter((l) => /ready|rewire/.test(l)).join('\n'));
    console.log(procs.get('s2')!.output().split('\n').filter((l) => /ready|rewire/.test(l)).join('\n'));
  }, 120_000);
});
