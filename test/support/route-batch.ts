// What the batched-decode route tests share (test/route-batch.test.ts on CPU nodes,
// test/route-batch-webgpu.test.ts on WebGPU nodes, test/route-batch-llamacpp.test.ts on
// llama.cpp nodes): concurrent OpenAI completions must give the same choices — text and every
// token's log-probability, so the logits are the same bits (llama.cpp: within a bound, its
// batches not being its bits) — as the same requests run one at a time, while every stage
// reports (GET /v1/status `batching`) that its decode steps did run in batches.
import { expect } from 'vitest';
import OpenAI from 'openai';
import type { BatchCounters } from '../../src/peer/compute-queue.ts';
import { getJson, waitForRoute } from './mesh.ts';
import type { ServeInfo } from './mesh.ts';

const REQUESTS: Array<{ prompt: string; temperature: number; seed?: number }> = [
  { prompt: 'Once upon a time', temperature: 0 },
  { prompt: 'Lily and Tom went to the park', temperature: 0 },
  { prompt: 'The little dog was sad because', temperature: 0.9, seed: 11 },
  { prompt: 'One day, a girl named Sue', temperature: 0 },
  { prompt: 'Mom said', temperature: 0.8, seed: 3 },
  { prompt: 'The sun was', temperature: 0 },
];

async function stageBatching(serve: ServeInfo, backend: string): Promise<BatchCounters[]> {
  const route = await waitForRoute(serve, 'ready');
  const out: BatchCounters[] = [];
  for (const st of route.stages) {
    const { body } = await getJson(`${st.peer.httpUrl}/v1/status`, serve.secret);
    expect(body.backend).toBe(backend);
    out.push(body.batching);
  }
  return out;
}

interface Choice {
  text: string;
  finish: string;
  logprobs: { tokens: string[]; token_logprobs: number[]; top_logprobs: Array<Record<string, number>>; text_offset: number[] } | null;
}

/** The same choices, their log-probabilities within `bound` of each other; the largest difference seen. */
function expectAlike(got: Choice[], want: Choice[], bound: number): number {
  let worst = 0;
  const near = (a: number, b: number, where: string) => {
    worst = Math.max(worst, Math.abs(a - b));
    expect(Math.abs(a - b), where).toBeLessThanOrEqual(bound);
  };
  expect(got.map((c) => [c.text, c.finish, c.logprobs?.tokens, c.logprobs?.text_offset])).toEqual(want.map((c) => [c.text, c.finish, c.logprobs?.tokens, c.logprobs?.text_offset]));
  got.forEach((c, i) => {
    const w = want[i]!.logprobs!;
    c.logprobs!.token_logprobs.forEach((lp, t) => near(lp, w.token_logprobs[t]!, `choice ${i}, token ${t}`));
    c.logprobs!.top_logprobs.forEach((top, t) => {
      expect(Object.keys(top).sort()).toEqual(Object.keys(w.top_logprobs[t]!).sort());
      for (const [k, v] of Object.entries(top)) near(v, w.top_logprobs[t]![k]!, `choice ${i}, token ${t}, '${k}'`);
    });
  });
  return worst;
}

/**
 * The requests one at a time (nothing batched), then all at once (batched on every stage, each
 * of `backend`): the same choices — log-probabilities the same bits, or within `logprobBound`
 * where it is given (returns the largest difference seen).
 */
export async function expectBatchedLikeSequential(serve: ServeInfo, stages: number, backend: 'cpu' | 'webgpu' | 'llamacpp', maxTokens = 24, logprobBound?: number): Promise<number> {
  const openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
  const complete = async (r: (typeof REQUESTS)[number]): Promise<Choice> => {
    const res = await openai.completions.create({ model: 'stories260K', prompt: r.prompt, max_tokens: maxTokens, temperature: r.temperature, ...(r.seed === undefined ? {} : { seed: r.seed }), logprobs: 2 });
    const c = res.choices[0]!;
    return { text: c.text, finish: c.finish_reason, logprobs: c.logprobs } as Choice;
  };
  const alone: Choice[] = [];
  for (const r of REQUESTS) alone.push(await complete(r));
  const before = await stageBatching(serve, backend);
  expect(before.map((b) => b.batches)).toEqual(new Array<number>(stages).fill(0)); // one at a time: nothing to batch
  for (const b of before) expect(b.alone > 0 && b.aloneMs > 0, JSON.stringify(b)).toBe(true); // every decode step ran alone, timed

  const together = await Promise.all(REQUESTS.map((r) => complete(r)));
  let worst = 0;
  if (logprobBound === undefined) expect(together).toEqual(alone);
  else worst = expectAlike(together, alone, logprobBound);
  const after = await stageBatching(serve, backend);
  for (const [stage, b] of after.entries()) {
    expect(b.batches, `stage ${stage}: ${JSON.stringify(b)}`).toBeGreaterThan(0);
    expect(b.largest).toBeGreaterThan(1);
    expect(b.largest).toBeLessThanOrEqual(REQUESTS.length);
    expect(b.fallbacks).toBe(0);
    expect(b.batchMs).toBeGreaterThan(0);
  }
  return worst;
}
