// `npm run bench -- batch [--backend cpu|llamacpp] [--sessions 1,8,32] [--tokens 32] [--rounds 3] [--threads N] [--layers 8 --embd 512 --ffn 1536 --vocab 4096] [--type f32|q8_0|…]`:
// aggregate decode tokens per second with 1, 8 and 32 sessions decoding at once on `serve` + a
// two-node route over a synthetic model — CPU nodes, or with `--backend llamacpp` llama.cpp
// ones (each stage's sessions sequences of a pooled llama_context) — (issue 22 part 6:
// concurrent sessions' decode steps that reach a stage together run as one batched pass). Each session is a streamed
// /v1/completions request of a short prompt and `tokens` greedy tokens (end of text biased
// away, so every session decodes them all); a level's aggregate is the decode tokens streamed
// back over the time from the first session's first token to the last session's end. The
// machine is shared, so the levels run side by side `rounds` times (1, 8, 32, 1, 8, 32, …) and
// each level's figure is its median. Every session's text at every level must be the text its
// prompt gives alone: the largest level's prompts are also run one at a time (the reference).
// Each CPU node computes on `threads` threads (default: its share of the cores, the two nodes
// splitting them); a llama.cpp node on llama.cpp's default (all cores but one). With
// --backend llamacpp, after the route is gone, `stagePassInProcess`: one llama.cpp stage
// holding the whole model in this process (bench/lib/stage-batch.ts) — ms of a step alone
// against ms per row in one forwardBatch at each level, and each level's rows against the
// same steps alone (bits, max |Δ|): what batching saves where no route or other process
// shares the cores. Each stage's batch counters (GET /v1/status) are reported per level.
// Goal: at 32 sessions ≥ 5× one's.
import { availableParallelism } from 'node:os';
import { defaultLlamaThreads } from '../src/backends/llamacpp/ffi.ts';
import { LlamaCppRangeStage } from '../src/backends/llamacpp/range-stage.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { cpuMs } from './lib/cpu-time.ts';
import { finishLoad, goal, machineLoad } from './lib/goals.ts';
import { WORDS, numberArg, round, shapeFrom, startServeRoute } from './lib/serve-route.ts';
import type { ServeRoute } from './lib/serve-route.ts';
import { readSseJson } from './lib/sse.ts';
import { stageBatchFigure } from './lib/stage-batch.ts';
import { killAllCli } from './processes.ts';

interface Stream {
  firstTokenAt: number;
  endAt: number;
  tokens: number;
  text: string;
}

async function stream(r: ServeRoute, prompt: string, tokens: number, eos: number): Promise<Stream> {
  const res = await fetch(`${r.base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${r.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: r.model, prompt, max_tokens: tokens, temperature: 0, logit_bias: { [eos]: -100 }, stream: true, stream_options: { include_usage: true } }),
  });
  let firstTokenAt = -1;
  let generated = -1;
  let text = '';
  await readSseJson(res, (c) => {
    if (firstTokenAt < 0 && (c.choices?.[0]?.text || c.choices?.[0]?.finish_reason)) firstTokenAt = performance.now();
    text += c.choices?.[0]?.text ?? '';
    if (c.usage) generated = c.usage.completion_tokens;
  });
  if (generated < 0) throw new Error('the stream ended without usage');
  return { firstTokenAt, endAt: performance.now(), tokens: generated, text };
}

type Batching = { batches: number; steps: number; largest: number; batchMs: number; alone: number; aloneMs: number };

/** each stage's batch counters, from its node's GET /v1/status */
async function stageBatching(r: ServeRoute): Promise<Batching[]> {
  const get = async (url: string) => (await fetch(url, { headers: { authorization: `Bearer ${r.secret}` } })).json() as Promise<any>;
  const room = await get(`${r.base}/v1/rooms/${r.roomId}`);
  const route = await get(`${r.base}/v1/routes/${room.route.id}`);
  return Promise.all(route.stages.map(async (st: any) => (await get(`${st.peer.httpUrl}/v1/status`)).batching));
}

/** session s's prompt: the same at every level and in every round, so its text can be checked against its own run alone */
const promptOf = (s: number): string => Array.from({ length: 6 }, (_, i) => WORDS[(i * 5 + s * 3) % WORDS.length]).join(' ');

export interface BatchRun {
  decodeTokens: number;
  wallMs: number;
  aggregateTokS: number;
  perSessionTokS: number;
  /** CPU ms each process spent per decode token during this run: serve, each node, and this bench's client (null where /proc cannot tell) */
  cpuMsPerToken: { serve: number | null; nodes: Array<number | null>; client: number };
  /** per stage during this run: batches and the steps in them (`largest`: the largest batch since the stage loaded); ms a step took in a batch, and alone */
  stageBatches: Array<{ batches: number; steps: number; largest: number; msPerStepBatched: number | null; alone: number; msPerStepAlone: number | null }>;
}

export interface BatchLevel {
  sessions: number;
  /** the runs' medians */
  aggregateTokS: number;
  perSessionTokS: number;
  /** each round's run */
  runs: BatchRun[];
}

/** `sessions` streams at once; decode tokens (all but each one's first) over first token → last end. Texts: what each session generated. */
async function level(r: ServeRoute, sessions: number, tokens: number, eos: number, first = 0): Promise<{ run: BatchRun; texts: string[] }> {
  const before = await stageBatching(r);
  const procs = [r.pids.serve, ...r.pids.nodes];
  const cpuBefore = procs.map(cpuMs);
  const clientBefore = process.cpuUsage();
  const streams = await Promise.all(Array.from({ length: sessions }, (_, s) => stream(r, promptOf(first + s), tokens, eos)));
  const client = process.cpuUsage(clientBefore);
  const cpuAfter = procs.map(cpuMs);
  const after = await stageBatching(r);
  const start = Math.min(...streams.map((s) => s.firstTokenAt));
  const end = Math.max(...streams.map((s) => s.endAt));
  const decodeTokens = streams.reduce((a, s) => a + s.tokens - 1, 0);
  const perSession = streams.map((s) => (s.tokens - 1) / ((s.endAt - s.firstTokenAt) / 1000));
  const perToken = (i: number): number | null => (cpuBefore[i] === null || cpuAfter[i] === null ? null : round((cpuAfter[i]! - cpuBefore[i]!) / decodeTokens, 3));
  const run = {
    decodeTokens,
    cpuMsPerToken: { serve: perToken(0), nodes: r.pids.nodes.map((_, i) => perToken(i + 1)), client: round((client.user + client.system) / 1000 / decodeTokens, 3) },
    wallMs: round(end - start),
    aggregateTokS: round(decodeTokens / ((end - start) / 1000)),
    perSessionTokS: round(perSession.reduce((a, b) => a + b, 0) / sessions),
    stageBatches: after.map((a, i) => {
      const b = before[i]!;
      const steps = a.steps - b.steps;
      const alone = a.alone - b.alone;
      return { batches: a.batches - b.batches, steps, largest: a.largest, msPerStepBatched: steps > 0 ? round((a.batchMs - b.batchMs) / steps, 2) : null, alone, msPerStepAlone: alone > 0 ? round((a.aloneMs - b.aloneMs) / alone, 2) : null };
    }),
  };
  return { run, texts: streams.map((s) => s.text) };
}

/** the middle value; of an even count, the mean of the two middle ones */
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[m]! : round((s[m - 1]! + s[m]!) / 2);
}

/** Part (b) of the serve bench, on a route already up: the levels side by side `rounds` times, their medians, the ratio of the largest to one session, and the token check. */
export async function batchedDecode(r: ServeRoute, levels: number[] = [1, 8, 32], tokens = 32, rounds = 3) {
  const eos = Number((await readHeader(r.path)).metadata['tokenizer.ggml.eos_token_id'] ?? 2);
  await level(r, 2, 4, eos, 99); // warm-up: JIT and sockets
  const top = Math.max(...levels);
  const runs = levels.map(() => [] as BatchRun[]);
  /** texts[s]: what session s's prompt gave in each run that had it */
  const texts: string[][] = Array.from({ length: top }, () => []);
  for (let round = 0; round < rounds; round++) {
    for (const [i, n] of levels.entries()) {
      // a level smaller than the largest takes its prompts from a different place each round
      const first = (round * n) % (top - n + 1);
      const l = await level(r, n, tokens, eos, first);
      runs[i]!.push(l.run);
      l.texts.forEach((t, s) => texts[first + s]!.push(t));
    }
  }
  // the reference: every prompt of the largest level alone, one at a time
  let mismatched = 0;
  for (let s = 0; s < top; s++) {
    const alone = (await level(r, 1, tokens, eos, s)).texts[0]!;
    mismatched += texts[s]!.filter((t) => t !== alone).length;
  }
  const out: BatchLevel[] = levels.map((sessions, i) => {
    const rs = runs[i]!;
    const m = median(rs.map((x) => x.aggregateTokS));
    return { sessions, aggregateTokS: m, perSessionTokS: median(rs.map((x) => x.perSessionTokS)), runs: rs };
  });
  const one = out.find((l) => l.sessions === 1) ?? out[0]!;
  const last = out[out.length - 1]!;
  const ratio = last.aggregateTokS / one.aggregateTokS;
  const compared = texts.reduce((a, t) => a + t.length, 0);
  // what batching saves on each stage's compute: a step alone (one session) against a step in the largest level's batches
  const stageMs = (l: BatchLevel, f: (b: BatchRun['stageBatches'][number]) => number | null, st: number): number | null => {
    const xs = l.runs.map((x) => f(x.stageBatches[st]!)).filter((x): x is number => x !== null);
    return xs.length > 0 ? median(xs) : null;
  };
  const stagePass = one.runs[0]!.stageBatches.map((_, st) => {
    const alone = stageMs(one, (b) => b.msPerStepAlone, st);
    const batched = stageMs(last, (b) => b.msPerStepBatched, st);
    return { msPerStepAlone: alone, msPerStepBatched: batched, speedup: alone !== null && batched ? round(alone / batched, 2) : null };
  });
  return {
    levels: out,
    stagePass,
    ratio: { [`aggregate${last.sessions}OverOne`]: round(ratio, 2) },
    tokens: { sessionsCompared: compared, differingFromAlone: mismatched, note: 'every session text at every level against its prompt run alone' },
    goal: goal(`aggregate decode tok/s at ${last.sessions} sessions / at ${one.sessions} (medians of ${rounds} rounds)`, mismatched === 0 ? ratio : 0, 'min', 5),
  };
}

export async function run(args: string[]): Promise<unknown> {
  const shape = shapeFrom(args);
  const i = args.indexOf('--sessions');
  const levels = i >= 0 ? args[i + 1]!.split(',').map(Number) : [1, 8, 32];
  const tokens = numberArg(args, 'tokens', 32);
  const rounds = numberArg(args, 'rounds', 3);
  // the two nodes share this machine: each computes on its half of the cores
  const threads = numberArg(args, 'threads', Math.max(1, Math.floor(availableParallelism() / 2)));
  const b = args.indexOf('--backend');
  const backend = b >= 0 ? args[b + 1] : 'cpu';
  if (backend !== 'cpu' && backend !== 'llamacpp') throw new Error(`--backend must be cpu or llamacpp, got '${backend}'`);
  const load = machineLoad();
  try {
    const r = await startServeRoute(shape, threads, backend);
    const res = await batchedDecode(r, levels, tokens, rounds);
    const route = backend === 'cpu' ? `2 CPU nodes (node processes, ${threads} thread(s) each) + serve, loopback` : '2 llama.cpp nodes (node processes, --backend llamacpp, its default threads) + serve, loopback';
    killAllCli();
    const inProcess = backend === 'llamacpp' ? { stagePassInProcess: await llamacppStagePass(r.path, shape.layers, shape.vocab, levels, rounds) } : {};
    return { bench: 'batch', backend, model: { ...shape, path: r.path }, route, tokensPerSession: tokens, rounds, ...res, ...inProcess, goals: [res.goal], load: finishLoad(load) };
  } finally {
    killAllCli();
  }
}

/** One llama.cpp stage holding the whole model in this process, on llama.cpp's default threads: a step alone against rows batched. */
async function llamacppStagePass(path: string, layers: number, vocab: number, levels: number[], rounds: number) {
  const source = await openTensorSource(path);
  const stage = new LlamaCppRangeStage({ threads: defaultLlamaThreads() });
  try {
    await stage.load(source, { start: 0, end: layers });
    return { threads: defaultLlamaThreads(), ...(await stageBatchFigure(stage, vocab, levels, rounds)) };
  } finally {
    await stage.dispose();
    await source.close();
  }
}
