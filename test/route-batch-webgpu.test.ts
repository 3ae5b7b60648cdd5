// Batched decode on a route of WebGPU nodes: `serve` + two `node --backend webgpu` (Dawn on
// SwiftShader here, stories260K): concurrent OpenAI completions give the same choices — text and
// every token's log-probability — as the same requests one at a time, and each WebGPU stage
// reports batches in its status (./support/route-batch.ts). --test-slow-factor makes a pass take
// a few times its own time, so other sessions' steps reach a stage while one computes.
import { afterAll, beforeAll, describe, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { killAll, serveWithNodes } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { expectBatchedLikeSequential } from './support/route-batch.ts';

let serve: ServeInfo;

beforeAll(async () => {
  serve = await serveWithNodes(await stories260K(), ['a', 'b'], ['--backend', 'webgpu', '--test-slow-factor', '4']);
}, 120_000);

afterAll(async () => {
  await killAll();
});

describe('batched decode on a two-stage WebGPU route', () => {
  it('concurrent completions give the same choices as one at a time, and the WebGPU stages ran them in batches', async () => {
    await expectBatchedLikeSequential(serve, 2, 'webgpu', 12); // (SwiftShader passes, slowed: 12 tokens a request overlap as well as 24)
  }, 240_000);
});
