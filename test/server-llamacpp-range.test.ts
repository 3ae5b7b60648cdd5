// llama.cpp nodes serving layer ranges, as real processes (`serve` + `node --backend llamacpp`
// over loopback): the planner splits two llama.cpp nodes, each reads only its shard's byte
// ranges and the route gives llama.cpp's greedy tokens; a llama.cpp node and a CPU node share
// a route; a shard whose bytes fail verification is refused by name and the node stays up;
// and capabilities decide before any download: a qwen3moe model (which llama.cpp runs only
// whole) is never given to a CPU node, and runs whole on a llama.cpp node — as `audit` says.
import { afterAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { shardBytes, shardTensors } from '../src/backends/shard.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import { runCli } from './support/cli.ts';
import { LlamaModelFfi, oracleGreedy } from './support/llamacpp-oracle.ts';
import { defaultLlamaThreads } from '../src/backends/llamacpp/ffi.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { qwen3MoeModel } from './support/moe-model.ts';
import { syntheticModelSpec } from '../src/model/synthetic-model.ts';
import { writeGgufFile } from '../src/gguf/writer.ts';
import { tamperedCopy } from './support/tampered.ts';
import { syntheticModel } from './support/synthetic.ts';

const N = 24;
const work = mkdtempSync(join(tmpdir(), 'gguf-mesh-llamarange-'));

afterAll(async () => {
  await killAll();
  rmSync(work, { recursive: true, force: true });
});

async function routeGreedy(serve: ServeInfo, prompt: readonly number[], n: number, hiddenDtype: 'f16' | 'f32' = 'f16'): Promise<{ tokens: number[]; info: any }> {
  const joined = await joinRoom(serve.joinUrl, serve.secret, 30_000);
  try {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + n, hiddenDtype });
    const tokens = [await c.prefill(prompt)];
    while (tokens.length < n) tokens.push(await c.decode(tokens.at(-1)!));
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    await c.close();
    return { tokens, info };
  } finally {
    await joined.close();
  }
}

async function expectedGreedy(path: string, prompt: readonly number[], n: number): Promise<number[]> {
  const oracle = await LlamaModelFfi.load(path);
  try {
    return oracleGreedy(oracle, prompt, n).tokens;
  } finally {
    oracle.dispose();
  }
}

/** Every byte each stage's node fetched lies in its shard's tensors, and it fetched each about once. */
async function expectOnlyShardBytes(serve: ServeInfo, model: string, stages: Array<{ peerId: string; shard: { start: number; end: number } }>): Promise<void> {
  const header = await readHeader(model);
  const fetches = (await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret)).body.clients;
  for (const st of stages) {
    const wanted = shardTensors(header, st.shard, 5);
    const lo = Math.min(...wanted.map((t) => t.offset));
    const hi = Math.max(...wanted.map((t) => t.offset + t.byteLength));
    const ranges = fetches[st.peerId].ranges as Array<[number, number]>;
    const fetched = ranges.reduce((a, [x, y]) => a + (y - x + 1), 0);
    for (const [x, y] of ranges) {
      expect(x).toBeGreaterThanOrEqual(lo);
      expect(y + 1).toBeLessThanOrEqual(hi);
    }
    expect(fetched).toBeLessThanOrEqual(1.02 * shardBytes(header, st.shard, 5) + 65536);
    expect(fetched).toBeLessThan(statSync(model).size);
  }
}

describe('llama.cpp nodes serving layer ranges', () => {
  it('two llama.cpp nodes: the planner splits them, each reads only its shard, tokens are llama.cpp\'s (f16 and f32 hops)', async () => {
    const model = await stories260K();
    const serve = await spawnServe(model, ['--min-peers', '2']);
    for (const name of ['a', 'b']) await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--name', name]).waitFor(/joined room/);
    const route = await waitForRoute(serve, 'ready');
    expect(route.stages.map((s: any) => [s.shard.start, s.shard.end, s.peer.backend])).toEqual([[0, 3, 'llamacpp'], [3, 5, 'llamacpp']]);
    const expected = await expectedGreedy(model, STORIES_PROMPT_TOKENS, N);
    const f16 = await routeGreedy(serve, STORIES_PROMPT_TOKENS, N);
    expect(f16.tokens).toEqual(expected);
    expect(f16.info.stages.map((s: any) => s.backend)).toEqual(['llamacpp', 'llamacpp']);
    expect(f16.info.stages.every((s: any) => s.kvBytes > 0)).toBe(true);
    expect((await routeGreedy(serve, STORIES_PROMPT_TOKENS, N, 'f32')).tokens).toEqual(expected);
    await expectOnlyShardBytes(serve, model, route.stages);
    await serve.proc.kill();
  });

  it('two llama.cpp nodes on a synthetic qwen3 Q4_K_M model: llama.cpp\'s tokens with f32 hops; --threads reaches llama.cpp', async () => {
    const model = await syntheticModel({ arch: 'qwen3', type: 'q4_k_m', layers: 3, embd: 256, heads: 4, kvHeads: 2, ffn: 512 });
    const serve = await spawnServe(model, ['--min-peers', '2']);
    const asked = defaultLlamaThreads() + 1; // not the default, so only the option explains it
    const a = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--layers', '0-1', '--threads', String(asked)]);
    await a.waitFor(/joined room/);
    const b = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--layers', '1-3']);
    await b.waitFor(/joined room/);
    await waitForRoute(serve, 'ready');
    // the engine says what its contexts compute on: the option given, else llama.cpp's default (all cores but one)
    await a.waitFor(new RegExp(`layers 0-1 ready \\([^)]*; ${asked} threads;`));
    await b.waitFor(new RegExp(`layers 1-3 ready \\([^)]*; ${defaultLlamaThreads()} threads?;`));
    const oracle = await LlamaModelFfi.load(model);
    const prompt = oracle.tokenize('The quick brown fox jumps over the lazy dog. It was');
    const expected = oracleGreedy(oracle, prompt, N).tokens;
    oracle.dispose();
    expect((await routeGreedy(serve, prompt, N, 'f32')).tokens).toEqual(expected);
    await serve.proc.kill();
  });

  it('a llama.cpp node and a CPU node (explicit layers) make one route with llama.cpp\'s tokens', async () => {
    const model = await stories260K();
    const serve = await spawnServe(model, ['--min-peers', '2']);
    await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--layers', '0-2']).waitFor(/joined room/);
    await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--layers', '2-5']).waitFor(/joined room/);
    const route = await waitForRoute(serve, 'ready');
    expect(route.stages.map((s: any) => s.peer.backend)).toEqual(['llamacpp', 'cpu']);
    expect((await routeGreedy(serve, STORIES_PROMPT_TOKENS, N)).tokens).toEqual(await expectedGreedy(model, STORIES_PROMPT_TOKENS, N));
    await serve.proc.kill();
  });

  it('a shard whose bytes fail verification is refused naming the tensor, and the node stays up', async () => {
    const model = await stories260K();
    const { path: copy, victim } = await tamperedCopy(model, work, 'tampered.gguf', (name) => name.startsWith('blk.3.'), 5, 0x10);
    const serve = await spawnServe(copy, ['--min-peers', '2']);
    await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--layers', '0-2', '--no-cache']).waitFor(/joined room/);
    const b = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--layers', '2-5', '--no-cache']);
    await b.waitFor(/joined room/);
    await b.waitFor(/load failed: TENSOR_HASH_MISMATCH/);
    const route = await waitForRoute(serve, 'degraded');
    expect(route.reason).toContain(victim.name);
    // the node is still there, answering on its frame server
    const listen = /listening at (\S+)/.exec(b.output())![1]!;
    const status = await fetch(`${listen}/v1/status`, { headers: { authorization: `Bearer ${serve.secret}` } });
    expect(status.status).toBe(200);
    expect(b.child.exitCode).toBeNull();
    await serve.proc.kill();
  });

  it('an architecture no engine here runs but llama.cpp: a CPU node is given nothing, decided before any download', async () => {
    // a synthetic llama renamed to gemma2 (its keys too): llama.cpp knows the name, the CPU engine does not
    const base = syntheticModelSpec({ layers: 2, embd: 64, heads: 2, ffn: 64, vocab: 600 });
    const spec = { ...base, metadata: base.metadata.map((m) => ({ ...m })) };
    for (const m of spec.metadata) {
      if (m.key === 'general.architecture') m.value = 'gemma2';
      else if (m.key.startsWith('llama.')) m.key = `gemma2.${m.key.slice('llama.'.length)}`;
    }
    const model = join(work, 'gemma2.gguf');
    await writeGgufFile(model, spec);
    const serve = await spawnServe(model);
    const cpu = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--name', 'cpu']);
    await cpu.waitFor(/joined room/);
    await new Promise((r) => setTimeout(r, 800)); // past the plan delay
    const forming = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body.route;
    expect(forming.status).toBe('forming');
    expect(forming.reason).toMatch(/no peer can serve gemma2: cpu-\w+ \(cpu\): it does not run architecture 'gemma2'/);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    const cpuPeer = peers.find((p: any) => p.backend === 'cpu');
    expect(cpuPeer.servable).toMatchObject({ ranges: false, wholeModel: false });
    // the CPU node fetched no model byte
    const modelId = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body.model.id;
    const fetches = (await getJson(`${serve.base}/v1/models/${modelId}/fetches`, serve.secret)).body.clients;
    expect(fetches[cpuPeer.id]).toBeUndefined();
    await serve.proc.kill();
  });

  it('qwen3moe: a llama.cpp node serves it whole, never as a range; audit agrees', async () => {
    const model = await qwen3MoeModel();
    const serve = await spawnServe(model);
    await spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'llamacpp', '--name', 'llama']).waitFor(/joined room/);
    const route = await waitForRoute(serve, 'ready');
    expect(route.stages.map((s: any) => [s.shard.start, s.shard.end, s.peer.backend])).toEqual([[0, 2, 'llamacpp']]);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    const llamaPeer = peers.find((p: any) => p.backend === 'llamacpp');
    expect(llamaPeer.servable).toMatchObject({ ranges: false, wholeModel: true });
    const oracle = await LlamaModelFfi.load(model);
    const prompt = oracle.tokenize('Once upon a time');
    const expected = oracleGreedy(oracle, prompt, N).tokens;
    oracle.dispose();
    expect((await routeGreedy(serve, prompt, N)).tokens).toEqual(expected);
    // audit reads the same capability table: llama.cpp ready whole model only
    const r = await runCli(['audit', model, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const report = JSON.parse(r.stdout);
    expect(report.backends.llamacpp.ready).toBe(true);
    expect(report.backends.llamacpp.notes.join(' ')).toMatch(/whole model only/);
    await serve.proc.kill();
  });
});
