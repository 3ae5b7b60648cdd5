// `npm run bench -- batch [--sessions 1,8,32] [--tokens 32] [--layers 8 --embd 512 --ffn 1536 --vocab 4096] [--type f32|q8_0|…]`:
// aggregate decode tokens per second with 1, 8 and 32 sessions decoding at once on `serve` + a
// two-node CPU route over a synthetic model (issue 22 part 6: concurrent sessions' decode steps
// that reach a stage together run as one batched pass). Each session is a streamed
// /v1/completions request of a short prompt and `tokens` greedy tokens (end of text biased
// away, so every session decodes them all); the aggregate is the decode tokens streamed back
// over the time from the first session's first token to the last session's end. Each stage's
// batch counters (GET /v1/status) are reported per level. Goal: at 32 sessions ≥ 5× one's.
import { readHeader } from '../src/gguf/parse.ts';
import { finishLoad, goal, machineLoad } from './lib/goals.ts';
import { WORDS, numberArg, round, shapeFrom, startServeRoute } from './lib/serve-route.ts';
import type { ServeRoute } from './lib/serve-route.ts';
import { readSseJson } from './lib/sse.ts';
import { killAllCli } from './processes.ts';


interface Stream {
  firstTokenAt: number;
  endAt: number;
  tokens: number;
}

async function stream(r: ServeRoute, prompt: string, tokens: number, eos: number): Promise<Stream> {
  const res = await fetch(`${r.base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${r.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: r.model, prompt, max_tokens: tokens, temperature: 0, logit_bias: { [eos]: -100 }, stream: true, stream_options: { include_usage: true } }),
  });
  let firstTokenAt = -1;
  let generated = -1;
  await readSseJson(res, (c) => {
    if (firstTokenAt < 0 && (c.choices?.[0]?.text || c.choices?.[0]?.finish_reason)) firstTokenAt = performance.now();
    if (c.usage) generated = c.usage.completion_tokens;
  });
  if (generated < 0) throw new Error('the stream ended without usage');
  return { firstTokenAt, endAt: performance.now(), tokens: generated };
}

/** each stage's batch counters, from its node's GET /v1/status */
async function stageBatching(r: ServeRoute): Promise<Array<{ batches: number; steps: number; largest: number }>> {
  const get = async (url: string) => (await fetch(url, { headers: { authorization: `Bearer ${r.secret}` } })).json() as Promise<any>;
  const room = await get(`${r.base}/v1/rooms/${r.roomId}`);
  const route = await get(`${r.base}/v1/routes/${room.route.id}`);
  return Promise.all(route.stages.map(async (st: any) => (await get(`${st.peer.httpUrl}/v1/status`)).batching));
}

export interface BatchLevel {
  sessions: number;
  decodeTokens: number;
  wallMs: number;
  aggregateTokS: number;
  perSessionTokS: number;
  /** per stage: batches run and the steps in them during this level; `largest`: the largest batch since the stage loaded */
  stageBatches: Array<{ batches: number; steps: number; largest: number }>;
}

/** `sessions` streams at once; decode tokens (all but each one's first) over first token → last end */
async function level(r: ServeRoute, sessions: number, tokens: number, eos: number, seed: number): Promise<BatchLevel> {
  const before = await stageBatching(r);
  const prompts = Array.from({ length: sessions }, (_, s) => Array.from({ length: 6 }, (_, i) => WORDS[(i * 5 + s * 3 + seed) % WORDS.length]).join(' '));
  const streams = await Promise.all(prompts.map((p) => stream(r, p, tokens, eos)));
  const after = await stageBatching(r);
  const start = Math.min(...streams.map((s) => s.firstTokenAt));
  const end = Math.max(...streams.map((s) => s.endAt));
  const decodeTokens = streams.reduce((a, s) => a + s.tokens - 1, 0);
  const perSession = streams.map((s) => (s.tokens - 1) / ((s.endAt - s.firstTokenAt) / 1000));
  return {
    sessions,
    decodeTokens,
    wallMs: round(end - start),
    aggregateTokS: round(decodeTokens / ((end - start) / 1000)),
    perSessionTokS: round(perSession.reduce((a, b) => a + b, 0) / sessions),
    stageBatches: after.map((a, i) => ({ batches: a.batches - before[i]!.batches, steps: a.steps - before[i]!.steps, largest: a.largest })),
  };
}

/** Part (b) of the serve bench, on a route already up: the levels side by side, and the ratio of the largest to one session. */
export async function batchedDecode(r: ServeRoute, levels: number[] = [1, 8, 32], tokens = 32) {
  const eos = Number((await readHeader(r.path)).metadata['tokenizer.ggml.eos_token_id'] ?? 2);
  await level(r, 2, 4, eos, 99); // warm-up: JIT and sockets
  const out: BatchLevel[] = [];
  for (const [i, n] of levels.entries()) out.push(await level(r, n, tokens, eos, i));
  const one = out.find((l) => l.sessions === 1) ?? out[0]!;
  const top = out[out.length - 1]!;
  const ratio = top.aggregateTokS / one.aggregateTokS;
  return {
    levels: out,
    ratio: { [`aggregate${top.sessions}OverOne`]: round(ratio, 2) },
    goal: goal(`aggregate decode tok/s at ${top.sessions} sessions / at ${one.sessions}`, ratio, 'min', 5),
  };
}

export async function run(args: string[]): Promise<unknown> {
  const shape = shapeFrom(args);
  const i = args.indexOf('--sessions');
  const levels = i >= 0 ? args[i + 1]!.split(',').map(Number) : [1, 8, 32];
  const tokens = numberArg(args, 'tokens', 32);
  const load = machineLoad();
  try {
    const r = await startServeRoute(shape);
    const b = await batchedDecode(r, levels, tokens);
    return { bench: 'batch', model: { ...shape, path: r.path }, route: '2 CPU nodes (node processes) + serve, loopback', tokensPerSession: tokens, ...b, goals: [b.goal], load: finishLoad(load) };
  } finally {
    killAllCli();
  }
}
