// Batched decode on a route: concurrent OpenAI completions on `serve` + two CPU nodes
// (stories260K) give the same choices — text and every token's log-probability, so the logits
// are the same bits — as the same requests run one at a time, while each stage reports that
// its decode steps did run in batches. The nodes run with --test-slow-factor so a forward takes
// a few milliseconds: the other sessions' steps then reach a stage while one computes, as they
// do on any real model, and the test does not depend on how fast this machine is.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { stories260K } from './support/models.ts';
import { getJson, killAll, serveWithNodes, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';

let serve: ServeInfo;
let openai: OpenAI;

beforeAll(async () => {
  serve = await serveWithNodes(await stories260K(), ['a', 'b'], ['--test-slow-factor', '20']);
  openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
}, 60_000);

afterAll(async () => {
  await killAll();
});

const REQUESTS: Array<{ prompt: string; temperature: number; seed?: number }> = [
  { prompt: 'Once upon a time', temperature: 0 },
  { prompt: 'Lily and Tom went to the park', temperature: 0 },
  { prompt: 'The little dog was sad because', temperature: 0.9, seed: 11 },
  { prompt: 'One day, a girl named Sue', temperature: 0 },
  { prompt: 'Mom said', temperature: 0.8, seed: 3 },
  { prompt: 'The sun was', temperature: 0 },
];

async function complete(r: (typeof REQUESTS)[number]): Promise<unknown> {
  const res = await openai.completions.create({ model: 'stories260K', prompt: r.prompt, max_tokens: 24, temperature: r.temperature, ...(r.seed === undefined ? {} : { seed: r.seed }), logprobs: 2 });
  const c = res.choices[0]!;
  return { text: c.text, finish: c.finish_reason, logprobs: c.logprobs };
}

interface Batching {
  batches: number;
  steps: number;
  largest: number;
  fallbacks: number;
  batchMs: number;
  alone: number;
  aloneMs: number;
}

async function stageBatching(): Promise<Batching[]> {
  const route = await waitForRoute(serve, 'ready');
  const out: Batching[] = [];
  for (const st of route.stages) {
    const { body } = await getJson(`${st.peer.httpUrl}/v1/status`, serve.secret);
    out.push(body.batching);
  }
  return out;
}

describe('batched decode on a two-stage CPU route', () => {
  it('concurrent completions give the same choices as one at a time, and the stages ran them in batches', async () => {
    const alone: unknown[] = [];
    for (const r of REQUESTS) alone.push(await complete(r));
    const before = await stageBatching();
    expect(before.map((b) => b.batches)).toEqual([0, 0]); // one at a time: nothing to batch
    for (const b of before) expect(b.alone > 0 && b.aloneMs > 0, JSON.stringify(b)).toBe(true); // every decode step ran alone, timed

    const together = await Promise.all(REQUESTS.map((r) => complete(r)));
    expect(together).toEqual(alone);
    const after = await stageBatching();
    for (const [stage, b] of after.entries()) {
      expect(b.batches, `stage ${stage}: ${JSON.stringify(b)}`).toBeGreaterThan(0);
      expect(b.largest).toBeGreaterThan(1);
      expect(b.largest).toBeLessThanOrEqual(REQUESTS.length);
      expect(b.fallbacks).toBe(0);
      expect(b.batchMs).toBeGreaterThan(0);
    }
  }, 120_000);
});
