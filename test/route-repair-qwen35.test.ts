// A qwen35moe session split over two native CPU nodes survives a killed stage: the spare that
// takes over rebuilds its Gated DeltaNet state (and the attention block's KV) by replay — a
// new stage 0 from the session's token history, a new last stage from the hidden states stage
// 0 logged — in other chunks than the lost peer computed them, and the text streamed is the
// text of an uninterrupted run. The rebuilt state is bit-identical (the chunked delta rule does
// not depend on batching), so the divergence check finds nothing. The uninterrupted split run
// itself is llama.cpp's greedy continuation of the same prompt tokens.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readHeader } from '../src/gguf/parse.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { LlamaModelFfi, oracleGreedy } from './support/llamacpp-oracle.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { streamCompletion } from './support/sse.ts';
import { syntheticModel } from './support/synthetic.ts';

const STAGES = ['0-2', '2-4'];
const PROMPT = 'The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks were striking thirteen.';
const GREEDY = { prompt: PROMPT, max_tokens: 60, temperature: 0 };
let serve: ServeInfo;
const nodes = new Map<string, MeshProcess>();
let spawned = 0;
let reference = '';

function spawnNode(layers: string): MeshProcess {
  const name = `q${spawned++}`;
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--layers', layers, '--name', name]);
  nodes.set(name, proc);
  return proc;
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  return room.route ? (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body : null;
}

async function readyWithSpares(): Promise<any> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await route();
    if (r?.status === 'ready' && r.stages.every((st: any) => r.spares.some((s: any) => s.stage === st.stage && s.status === 'ready'))) return r;
    if (Date.now() > deadline) throw new Error(`no ready route with spares: ${JSON.stringify(r)}\n${serve.proc.output().slice(-3000)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

beforeAll(async () => {
  const model = await syntheticModel({ arch: 'qwen35moe', layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512, expertFfn: 256, sharedFfn: 256, linearKHeads: 2, linearVHeads: 4, linearHeadDim: 32 });
  serve = await spawnServe(model, ['--min-peers', '2', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '8000']);
  for (const layers of STAGES) await spawnNode(layers).waitFor(/joined room/);
  for (const layers of STAGES) spawnNode(layers); // a spare per stage
  await readyWithSpares();
  const out = await streamCompletion(serve.base, serve.secret, GREEDY);
  expect(out.errors).toEqual([]);
  expect(out.chunks).toBeGreaterThan(30);
  reference = out.text;
  // llama.cpp on the whole file: the same prompt tokens (our qwen35 tokenizer), its greedy tokens, up to end of generation
  const tokenizer = Tokenizer.fromMetadata((await readHeader(model)).metadata);
  const oracle = await LlamaModelFfi.load(model);
  try {
    const prompt = oracle.tokenize(PROMPT);
    expect(tokenizer.encode(PROMPT)).toEqual(prompt);
    const greedy = oracleGreedy(oracle, prompt, GREEDY.max_tokens).tokens;
    const eog = greedy.findIndex((t) => tokenizer.isEog(t));
    expect(reference).toBe(tokenizer.decode(eog < 0 ? greedy : greedy.slice(0, eog)));
  } finally {
    oracle.dispose();
  }
}, 180_000);

afterAll(async () => {
  await killAll();
});

describe('qwen35moe over two native nodes, a stage killed mid-stream', () => {
  for (const [stage, label] of [[0, 'first'], [1, 'last']] as const) {
    it(`kill -9 of the ${label} stage: repaired by replay, the same greedy text`, async () => {
      const r = await readyWithSpares();
      const name = (r.stages[stage].peerId as string).split('-')[0]!;
      let fired: Promise<unknown> | null = null;
      const out = await streamCompletion(serve.base, serve.secret, GREEDY, (n) => {
        if (n === 25) fired = nodes.get(name)!.kill('SIGKILL');
      });
      expect(fired, `only ${out.chunks} chunks`).not.toBeNull();
      await fired;
      expect(out.errors, JSON.stringify(out.errors)).toEqual([]);
      expect(out.text).toBe(reference);
      const repaired = out.events.filter((e) => e.type === 'route_repaired');
      expect(repaired.length, JSON.stringify(out.events.map((e) => e.type))).toBeGreaterThanOrEqual(1);
      expect(repaired[0].stages).toContain(stage);
      expect(repaired[0].tokensReplayed).toBeGreaterThan(0);
      const { tokensReplayed, bytesReplayed, divergenceChecked, firstDivergentPosition } = repaired[0];
      console.log(`qwen35moe ${label} stage killed: ${JSON.stringify({ tokensReplayed, bytesReplayed, divergenceChecked, firstDivergentPosition })}, text ${JSON.stringify(out.text.slice(0, 60))}…`);
      if (repaired[0].divergenceChecked) expect(repaired[0].firstDivergentPosition).toBeNull();
      spawnNode(STAGES[stage]!);
    }, 90_000);
  }
});
