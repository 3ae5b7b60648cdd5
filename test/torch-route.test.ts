// Routes with PyTorch peers (peers/torch/, the protocol's second implementation, started as
// `gguf-mesh node --backend torch`): PyTorch stages only, and PyTorch mixed with the CPU
// reference (PyTorch → TypeScript over binary HTTP and WebSocket, TypeScript → PyTorch over
// WebSocket), give llama.cpp's greedy tokens
// on stories260K and on synthetic llama/qwen2/qwen3 models; the hidden state a PyTorch stage
// sends equals the CPU reference's; no stage recomputes the prompt while decoding. With PyTorch
// stages in the middle and last, tokens take the one-way path (ReturnDirect) and speculative
// decoding (Verify frames) gives llama.cpp's greedy tokens, the rejected drafts rolled back.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { Sampler, tokenLogprob } from '../src/model/sampler.ts';
import { DType, FrameFlag, FrameType } from '../src/protocol/frame.ts';
import { hiddenFrame, jsonFrame } from '../src/protocol/payload.ts';
import type { StepTiming } from '../src/protocol/payload.ts';
import { newSessionId } from '../src/protocol/session.ts';
import { WsLink } from '../src/transport/ws.ts';
import type { SamplerOptions } from '../src/model/sampler.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { greedyGenerate, loadModel, tokenize } from './support/llama.ts';
import { LlamaModelFfi, maxAbsDiff, oracleGreedy, oracleHidden } from './support/llamacpp-oracle.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { startRecordingPeer } from './support/recording-peer.ts';
import type { RecordingPeer } from './support/recording-peer.ts';
import { syntheticModel } from './support/synthetic.ts';

const N = 24;
const PROMPTS = ['Once upon a time', 'The little dog'];

let storiesPath: string;
let llama: LlamaModel;

beforeAll(async () => {
  storiesPath = await stories260K();
  llama = await loadModel(storiesPath);
});

afterAll(async () => {
  await llama?.dispose();
  await killAll();
});

/** A `gguf-mesh node` joined to `serve`; waits until it says it joined. */
async function node(serve: ServeInfo, backend: 'torch' | 'cpu', name: string, memory: string, extra: string[] = []): Promise<void> {
  const n = spawnMesh(['node', '--join', serve.joinUrl, '--backend', backend, '--memory', memory, '--name', name, '--no-cache', ...extra]);
  await n.waitFor(/joined room/, 120_000);
}

/** Greedy tokens sampled on the last stage, and the session's status before it closes. */
async function generateOnRoute(joined: JoinedRoom, serve: ServeInfo, prompt: number[], n: number, body: Record<string, unknown> = {}): Promise<{ tokens: number[]; info: any; after: any; timings: number[]; records: StepTiming[] }> {
  const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64, ...body });
  c.wantTimings = true;
  const tokens = [await c.prefill(prompt, 2)];
  while (tokens.length < n) tokens.push(await c.decode(tokens.at(-1)!));
  const records = [...c.lastTimings];
  const timings = records.map((t) => t.stage);
  const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
  await c.close();
  const after = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
  return { tokens, info, after, timings, records };
}

/** Every stage processed prompt + fed tokens exactly once per layer, held KV, and freed it on close. */
function expectNoRecompute(r: { info: any; after: any }, fed: number): void {
  for (const st of r.info.stages) {
    expect(st.processedTokens, `stage ${st.stage}`).toEqual(new Array(st.shard.end - st.shard.start).fill(fed));
    expect(st.position).toBe(fed);
    expect(st.kvBytes).toBeGreaterThan(0);
  }
  expect(r.after.state).toBe('closed');
  for (const st of r.after.stages) expect(st.kvBytes).toBe(0);
}

describe('stories260K on two PyTorch peers', () => {
  let serve: ServeInfo;
  let joined: JoinedRoom;

  beforeAll(async () => {
    serve = await spawnServe(storiesPath, ['--min-peers', '2']);
    // both stages are PyTorch peers, so their join order does not matter: start them together
    await Promise.all([node(serve, 'torch', 't0', '1GiB'), node(serve, 'torch', 't1', '1GiB')]);
    await waitForRoute(serve, 'ready', 120_000);
    joined = await joinRoom(serve.joinUrl, serve.secret);
  });
  afterAll(async () => {
    await joined?.close();
    await serve?.proc.kill();
  });

  it('plans two torch stages', async () => {
    const route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route.stages).toHaveLength(2);
    expect(route.stages.map((s: any) => s.peer.backend)).toEqual(['torch', 'torch']);
    expect(route.stages[0].shard.start).toBe(0);
    expect(route.stages[1].shard.end).toBe(5);
  });

  it("greedy tokens equal llama.cpp's; decode never recomputes the prompt; close frees every KV cache", async () => {
    for (const text of PROMPTS) {
      const prompt = tokenize(llama, text);
      const expected = await greedyGenerate(llama, prompt, N);
      const r = await generateOnRoute(joined, serve, prompt, N);
      expect(r.tokens).toEqual(expected);
      expect(r.timings).toEqual([0, 1]);
      expectNoRecompute(r, prompt.length + N - 1);
      expect(r.info.stages.every((s: any) => s.backend === 'torch')).toBe(true);
    }
  });

  it('a 300-token prompt in one chunk (KV caches grow past 256 positions, attention runs in query blocks) gives llama.cpp\'s tokens', async () => {
    const text = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. ';
    const prompt = tokenize(llama, text.repeat(12)).slice(0, 300);
    expect(prompt).toHaveLength(300);
    const expected = await greedyGenerate(llama, prompt, 8, 320);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 320 });
    const tokens = [await c.prefill(prompt, 300)];
    while (tokens.length < 8) tokens.push(await c.decode(tokens.at(-1)!));
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    await c.close();
    expect(tokens).toEqual(expected);
    expect(info.stages[0].processedTokens[0]).toBe(307);
  });

  it('f32 hidden states and client-side sampling from Logits frames give the same tokens', async () => {
    const expected = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, 12);
    expect((await generateOnRoute(joined, serve, STORIES_PROMPT_TOKENS, 12, { hiddenDtype: 'f32' })).tokens).toEqual(expected);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 32 });
    const tokens: number[] = [];
    let logits = await c.logits(STORIES_PROMPT_TOKENS);
    while (tokens.length < 12) {
      tokens.push(logits.indexOf(Math.max(...logits)));
      if (tokens.length < 12) logits = await c.logits([tokens.at(-1)!]);
    }
    await c.close();
    expect(tokens).toEqual(expected);
  });

  it("seeded sampling with penalties and logit bias on the torch last stage picks what the TypeScript sampler picks from the route's own logits, with the same log-probabilities", async () => {
    const settings: SamplerOptions = { temperature: 0.9, topK: 40, topP: 0.95, minP: 0.02, repeatPenalty: 1.2, frequencyPenalty: 0.3, presencePenalty: 0.2, repeatLastN: 16, logitBias: { '432': -2 }, seed: 4321 };
    const n = 40;
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64, sampler: settings, tokens: STORIES_PROMPT_TOKENS, logprobs: 3 });
    const sampled = [await c.prefill(STORIES_PROMPT_TOKENS)];
    const lps = [c.lastLogprob];
    while (sampled.length < n) {
      sampled.push(await c.decode(sampled.at(-1)!));
      lps.push(c.lastLogprob);
    }
    await c.close();
    // the same positions' logits from the route, sampled here
    const ours = new Sampler(settings);
    const history = [...STORIES_PROMPT_TOKENS];
    const l = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    let logits = await l.logits(STORIES_PROMPT_TOKENS);
    for (let i = 0; i < n; i++) {
      const t = ours.sample(logits, history);
      expect(t, `token ${i}`).toBe(sampled[i]);
      const lp = tokenLogprob(logits, t, 3);
      expect(lps[i]!.logprob).toBe(Math.fround(lp.logprob));
      expect(lps[i]!.top).toEqual(lp.top.map((x) => ({ token: x.token, logprob: Math.fround(x.logprob) })));
      history.push(t);
      if (i < n - 1) logits = await l.logits([t]);
    }
    await l.close();
    expect(new Set(sampled).size).toBeGreaterThan(10); // it sampled, not a greedy loop
  });
});

describe('stories260K on a mixed route: PyTorch → CPU reference over binary HTTP, CPU reference → PyTorch over WebSocket', () => {
  let serve: ServeInfo;
  let joined: JoinedRoom;

  beforeAll(async () => {
    serve = await spawnServe(storiesPath, ['--min-peers', '3']);
    // memory 1 : 2 : 1 → layers [0,1) [1,4) [4,5); m0 sends to the cpu node over binary HTTP
    await node(serve, 'torch', 'm0', '1GiB', ['--carrier', 'http']);
    await node(serve, 'cpu', 'm1', '2GiB');
    await node(serve, 'torch', 'm2', '1GiB');
    await waitForRoute(serve, 'ready', 120_000);
    joined = await joinRoom(serve.joinUrl, serve.secret);
  });
  afterAll(async () => {
    await joined?.close();
    await serve?.proc.kill();
  });

  it("gives llama.cpp's greedy tokens with every stage processing each position once", async () => {
    const route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route.stages.map((s: any) => [s.peer.backend, s.shard.start, s.shard.end])).toEqual([['torch', 0, 1], ['cpu', 1, 4], ['torch', 4, 5]]);
    const expected = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, N);
    const r = await generateOnRoute(joined, serve, STORIES_PROMPT_TOKENS, N);
    expect(r.tokens).toEqual(expected);
    expect(r.timings).toEqual([0, 1, 2]);
    expectNoRecompute(r, STORIES_PROMPT_TOKENS.length + N - 1);
  });
});

describe.each(['llama', 'qwen2', 'qwen3'] as const)('synthetic %s (f32, 4 heads / 2 KV heads): PyTorch stage 0 → CPU reference stage 1', (arch) => {
  let path: string;
  let serve: ServeInfo;
  let joined: JoinedRoom;
  let recorder: RecordingPeer;
  let oracle: LlamaModelFfi;

  beforeAll(async () => {
    path = await syntheticModel({ arch, type: 'f32', layers: 2, embd: 128, heads: 4, kvHeads: 2, ffn: 256, ...(arch === 'qwen3' ? { headDim: 48 } : {}) });
    oracle = await LlamaModelFfi.load(path);
    serve = await spawnServe(path, ['--min-peers', '2']);
    await node(serve, 'torch', 's0', '1GiB', ['--layers', '0-1']);
    recorder = await startRecordingPeer(serve.joinUrl, serve.secret, path, { name: 'rec', memoryBytes: 1 << 30, layers: { start: 1, end: 2 } });
    await waitForRoute(serve, 'ready', 120_000);
    joined = await joinRoom(serve.joinUrl, serve.secret);
  });
  afterAll(async () => {
    await joined?.close();
    await recorder?.close();
    oracle?.dispose();
    await serve?.proc.kill();
  });

  it("greedy tokens equal llama.cpp's; the hidden state PyTorch sent equals the CPU reference's and llama.cpp's; decode sends one new row per step", async () => {
    const prompt = oracle.tokenize('The quick brown fox jumps over the lazy dog. It was');
    const n = 16;
    const ref = oracleGreedy(oracle, prompt, n);
    const r = await generateOnRoute(joined, serve, prompt, n, { hiddenDtype: 'f32' });
    expect(r.tokens).toEqual(ref.tokens);
    expectNoRecompute(r, prompt.length + n - 1);

    // what arrived at stage 1: the prompt in chunks of 2, then one row per decode step
    const got = recorder.backend()!.inputs;
    const rows = got.map((x) => (x.input.kind === 'hidden' ? x.input.nTokens : 0));
    expect(got.map((x) => x.position)).toEqual(rows.map((_, i) => rows.slice(0, i).reduce((a, b) => a + b, 0)));
    expect(rows.slice(-(n - 1))).toEqual(new Array(n - 1).fill(1));
    const sent = Float32Array.from(got.flatMap((x) => (x.input.kind === 'hidden' ? [...x.input.hidden] : [])).slice(0, prompt.length * 128));

    const cpu = new CpuBackend();
    const source = await openTensorSource(path);
    try {
      await cpu.load(source, { start: 0, end: 1 });
      await cpu.openSession('h', { contextLength: prompt.length });
      const out = (await cpu.forward('h', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
      expect(out.kind).toBe('hidden');
      const diffCpu = maxAbsDiff(sent, out.kind === 'hidden' ? out.hidden : new Float32Array(0));
      const diffLlama = maxAbsDiff(sent, oracleHidden(oracle, prompt, 1));
      console.log(`${arch}: hidden after layer 0, PyTorch vs CPU reference ${diffCpu.toExponential(2)}, vs llama.cpp ${diffLlama.toExponential(2)}`);
      expect(diffCpu).toBeLessThan(1e-4);
      expect(diffLlama).toBeLessThan(1e-4);
    } finally {
      await cpu.dispose();
      await source.close();
    }
  });
});

describe('stories260K with PyTorch stages in the middle and last (CPU 0-1 → PyTorch 1-3 → PyTorch 3-5): the one-way token path, speculative decoding', () => {
  let serve: ServeInfo;
  let joined: JoinedRoom;
  let route: any;

  beforeAll(async () => {
    serve = await spawnServe(storiesPath, ['--min-peers', '3']);
    await node(serve, 'cpu', 'w0', '1GiB', ['--layers', '0-1']);
    await node(serve, 'torch', 'w1', '1GiB', ['--layers', '1-3']);
    await node(serve, 'torch', 'w2', '1GiB', ['--layers', '3-5']);
    await waitForRoute(serve, 'ready', 120_000);
    joined = await joinRoom(serve.joinUrl, serve.secret);
    route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
  });
  afterAll(async () => {
    await joined?.close();
    await serve?.proc.kill();
  });

  it("takes the one-way token path with llama.cpp's tokens: the stages before the last answer once their hidden states are sent, the last stage's token goes to the server on its own", async () => {
    expect(route.stages.map((s: any) => [s.peer.backend, s.shard.start, s.shard.end])).toEqual([['cpu', 0, 1], ['torch', 1, 3], ['torch', 3, 5]]);
    const expected = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, N);
    const oneWay = await generateOnRoute(joined, serve, STORIES_PROMPT_TOKENS, N);
    const climb = await generateOnRoute(joined, serve, STORIES_PROMPT_TOKENS, N, { tokenPath: 'climb' });
    expect(oneWay.tokens).toEqual(expected);
    expect(climb.tokens).toEqual(expected);
    expectNoRecompute(oneWay, STORIES_PROMPT_TOKENS.length + N - 1);
    // every stage's record came forward on the hidden states and reached the client with the token
    expect(oneWay.timings).toEqual([0, 1, 2]);
    const waited = (r: { info: any }) => r.info.stages.map((st: any) => st.timing.downstreamMs);
    // one-way: no stage waited for the one after it (the torch middle stage included) …
    expect(waited(oneWay)).toEqual([0, 0, 0]);
    // … while climbing, the stages before the last waited for every token to come back
    expect(waited(climb).slice(0, 2).every((ms: number) => ms > 0), JSON.stringify(waited(climb))).toBe(true);
    // the last stage's record holds the return hop to the server only on the one-way path
    expect(oneWay.records[2]!.downstreamUs).toBeGreaterThan(0);
    expect(climb.records[2]!.downstreamUs).toBe(0);
  });

  it("speculates: llama.cpp's greedy tokens in fewer route passes, the drafts the route rejected rolled back on the PyTorch stages", async () => {
    const prompts = ['Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball.', 'The sun was hot. A dog ran to the park, and a bird sang.'];
    const n = 48;
    let proposed = 0;
    let accepted = 0;
    for (const text of prompts) {
      const prompt = tokenize(llama, text);
      const expected = await greedyGenerate(llama, prompt, n, prompt.length + n + 24);
      const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + n + 24, speculate: 4 });
      c.wantTimings = true;
      const tokens = [await c.prefill(prompt)];
      while (tokens.length < n) tokens.push(await c.decode(tokens.at(-1)!));
      const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
      await c.close();
      expect(tokens).toEqual(expected);
      const spec = info.speculation;
      console.log(`torch route, ${JSON.stringify(text.slice(0, 16))}: ${JSON.stringify(spec)}; tokens per pass ${(spec.tokens / spec.passes).toFixed(2)}`);
      expect(spec.tokens).toBe(n - 1);
      expect(spec.passes).toBeLessThan(spec.tokens);
      proposed += spec.proposed;
      accepted += spec.accepted;
      // the torch stages computed the drafts too: more positions than the client fed
      const fed = prompt.length + n - 1;
      for (const st of info.stages.slice(1)) expect(st.processedTokens[0], `stage ${st.stage}`).toBeGreaterThan(fed);
    }
    // some drafts were rejected, and the next Verify frame dropped them on every stage: else its
    // position would not match (POSITION_MISMATCH) or the tokens would differ from llama.cpp's
    expect(accepted).toBeGreaterThan(0);
    expect(proposed).toBeGreaterThan(accepted);
  });

  it("a one-way step whose next stage does not know the session is answered at once; the failure, naming stage 2, answers the session's next frame", async () => {
    const torchMiddle = route.stages[1].peer.listen as string;
    const link = await WsLink.connect(torchMiddle, { headers: { authorization: `Bearer ${serve.secret}` } });
    try {
      const at = { routeId: joined.routeId, sessionId: newSessionId() };
      // opened on this stage only: the last stage never heard of it
      await link.request(jsonFrame(FrameType.SessionOpen, at, { contextLength: 8 }));
      const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
      const width = (await getJson(`${serve.base}/v1/models/${room.model.id}/manifest`, serve.secret)).body.hyper_parameters.n_embd as number;
      const step = (position: number) => hiddenFrame(at, position, new Float32Array(width), 1, DType.F16, FrameFlag.Sample | FrameFlag.ReturnDirect);
      const first = await link.request(step(0));
      expect(first.type).toBe(FrameType.Status);
      expect(JSON.parse(new TextDecoder().decode(first.payload))).toEqual({ stage: 1, position: 1, forwarded: true });
      // a frame at a position the stage does not hold changes nothing: POSITION_MISMATCH until the
      // failure downstream came back, which then answers first
      let err: any;
      for (let i = 0; i < 100; i++) {
        err = await link.request(step(5)).then(() => null, (e: unknown) => e);
        if (err?.code !== 'POSITION_MISMATCH') break;
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(err?.code).toBe('SESSION_UNKNOWN');
      expect(err.details?.stage).toBe(2);
      expect(err.message).toMatch(/is not open on stage 2/);
    } finally {
      await link.close();
    }
  });
});
