// Batched decode on a route of llama.cpp nodes: concurrent OpenAI completions on `serve` + two
// `node --backend llamacpp` processes (stories260K split between them, each stage a pooled
// llama_context, src/backends/llamacpp/range-pool.ts) give the texts of the same requests run
// one at a time, with every token's log-probability within 1e-3 of it (llama.cpp's batches are
// not its bits: test/llamacpp-batch.test.ts bounds the logits; the hops here are f16, which a
// 1e-5 change can flip by one rounding), while each stage reports that its decode steps ran in
// batches. --test-slow-factor makes a forward take a few milliseconds, so the other sessions'
// steps reach a stage while one computes (see test/route-batch.test.ts).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { killAll, serveWithNodes } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { expectBatchedLikeSequential } from './support/route-batch.ts';

let serve: ServeInfo;

beforeAll(async () => {
  serve = await serveWithNodes(await stories260K(), ['a', 'b'], ['--backend', 'llamacpp', '--test-slow-factor', '20']);
}, 60_000);

afterAll(async () => {
  await killAll();
});

describe('batched decode on a two-stage llama.cpp route', () => {
  it('concurrent completions give the texts of one at a time, log-probabilities within 1e-3, and the stages ran them in batches', async () => {
    const worst = await expectBatchedLikeSequential(serve, 2, 'llamacpp', 24, 1e-3);
    console.log(`llama.cpp route: largest log-probability difference, batched vs one at a time: ${worst}`);
    expect(worst).toBeLessThanOrEqual(1e-3);
  }, 120_000);
});
