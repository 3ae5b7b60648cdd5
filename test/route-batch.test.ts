// Batched decode on a route: concurrent OpenAI completions on `serve` + two CPU nodes
// (stories260K) give the same choices — text and every token's log-probability, so the logits
// are the same bits — as the same requests run one at a time, while each stage reports that
// its decode steps did run in batches (./support/route-batch.ts). The nodes run with
// --test-slow-factor so a forward takes a few milliseconds: the other sessions' steps then
// reach a stage while one computes, as they do on any real model, and the test does not depend
// on how fast this machine is.
import { afterAll, beforeAll, describe, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { killAll, serveWithNodes } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { expectBatchedLikeSequential } from './support/route-batch.ts';

let serve: ServeInfo;

beforeAll(async () => {
  serve = await serveWithNodes(await stories260K(), ['a', 'b'], ['--test-slow-factor', '20']);
}, 60_000);

afterAll(async () => {
  await killAll();
});

describe('batched decode on a two-stage CPU route', () => {
  it('concurrent completions give the same choices as one at a time, and the stages ran them in batches', async () => {
    await expectBatchedLikeSequential(serve, 2, 'cpu');
  }, 120_000);
});
