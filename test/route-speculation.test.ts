// Speculative decoding over a 3-stage route of real serve and node processes: greedy completions
// with `serve --speculate 4` give the same text as the same request without speculation, for a
// repetitive prompt (most drafts accepted) and a non-repetitive one; the session's summary
// shows fewer route passes than tokens; and a stage killed mid-generation, with a warm spare,
// still gives the same text.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';

const STAGES = ['0-2', '2-3', '3-5'];
let serve: ServeInfo;
const nodes = new Map<string, MeshProcess>();

function spawnNode(name: string, layers: string): void {
  nodes.set(name, spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--layers', layers, '--name', name]));
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  return room.route ? (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body : null;
}

async function until(ok: (r: any) => boolean, what: string): Promise<any> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await route();
    if (r && ok(r)) return r;
    if (Date.now() > deadline) throw new Error(`${what}: ${JSON.stringify(r)}\n${serve.proc.output().slice(-3000)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

const REPETITIVE = 'Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball.';
const PLAIN = 'The sun was hot. A dog ran to the park, and a bird sang.';

function complete(prompt: string, speculate: number | undefined, onChunk?: (n: number) => void) {
  return streamCompletion(serve.base, serve.secret, { model: 'stories260K', prompt, max_tokens: 200, temperature: 0, cache_prompt: false, ...(speculate !== undefined ? { speculate } : {}) }, onChunk);
}

const summaryOf = (events: any[]): any => events.find((e) => e.type === 'session_summary');

describe('speculative decoding over a 3-stage route', () => {
  beforeAll(async () => {
    serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--speculate', '4']);
    STAGES.forEach((l, i) => spawnNode(`s${i}`, l));
    await until((r) => r.status === 'ready', 'no ready route');
  }, 90_000);
  afterAll(killAll);

  for (const [name, prompt] of [['repetitive', REPETITIVE], ['non-repetitive', PLAIN]] as const) {
    it(`gives plain greedy decoding's text (${name} prompt), in fewer route passes than tokens`, async () => {
      const plain = await complete(prompt, 0);
      const spec = await complete(prompt, undefined);
      expect(plain.errors).toEqual([]);
      expect(spec.errors).toEqual([]);
      expect(spec.text).toBe(plain.text);
      expect(summaryOf(plain.events)?.speculation).toBeUndefined();
      const s = summaryOf(spec.events).speculation;
      console.log(`${name}: ${JSON.stringify(s)}; acceptance ${(s.accepted / Math.max(1, s.proposed)).toFixed(3)}, tokens per pass ${(s.tokens / s.passes).toFixed(2)}`);
      expect(s.tokens).toBe(summaryOf(spec.events).generatedTokens - 1);
      expect(s.passes).toBeLessThan(s.tokens);
      if (name === 'repetitive') expect(s.tokens / s.passes).toBeGreaterThan(1.5);
    }, 60_000);
  }

  it('a stage killed mid-generation, with a warm spare, still gives the same text', async () => {
    const reference = await complete(REPETITIVE, 0);
    spawnNode('spare1', STAGES[1]!);
    await until((r) => r.spares.some((s: any) => s.stage === 1 && s.status === 'ready'), 'no ready spare for stage 1');
    const victim = (await route()).stages[1].peerId.split('-')[0];
    let killed = false;
    const out = await complete(REPETITIVE, undefined, (n) => {
      if (n === 20 && !killed) {
        killed = true;
        nodes.get(victim)!.kill('SIGKILL');
      }
    });
    expect(killed).toBe(true);
    expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
    expect(out.text).toBe(reference.text);
    expect(out.events.some((e) => e.type === 'route_repaired')).toBe(true);
    const s = summaryOf(out.events)?.speculation;
    expect(s.passes).toBeLessThan(s.tokens);
  }, 90_000);
});
