// Batched decode on the CPU engine (forwardBatch): sessions with different histories, at
// different positions, decoded in one pass per stage give the same hidden states and logits,
// bit for bit, as each session decoded alone through `forward` — on stories260K (whole, and as
// a two-stage chain), on synthetic models that reach every kernel path a row takes (int8 and
// dequantised-tile weights, f16 rounding, biases, Q/K norms, a mixture of experts, Gemma's
// sliding window and soft-capped logits, a feed-forward size that is not a multiple of 4,
// Gated DeltaNet layers), with worker threads, and with a batch that fails part-way.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import type { ShardRange } from '../src/backends/types.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { decodeBothWays, expectRefusedBatchesChangeNothing } from './support/batch-check.ts';
import { stories260K } from './support/models.ts';
import { syntheticModel } from './support/synthetic.ts';

const toClose: Array<{ dispose(): Promise<void> } | TensorSource> = [];
afterAll(async () => {
  for (const d of toClose.reverse()) await ('dispose' in d ? d.dispose() : d.close());
});

async function chain(source: TensorSource, ranges: ShardRange[], make: () => CpuBackend = () => new CpuBackend()): Promise<CpuBackend[]> {
  const stages: CpuBackend[] = [];
  for (const r of ranges) {
    const b = make();
    await b.load(source, r);
    toClose.push(b);
    stages.push(b);
  }
  return stages;
}

const STORY_PROMPTS = [[1, 403, 407, 261, 378], [1, 29871], [1, 365, 2354, 322, 4335, 3512, 304, 278], [1, 9038, 2501, 263, 931], [1, 450]];

describe('forwardBatch on the CPU engine', () => {
  it('stories260K, whole and split in two: every step of every session the same bits as decoding it alone', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const vocab = configFromHeader(source.header).nVocab;
    const prompts = STORY_PROMPTS.map((p) => p.map((t) => t % vocab));
    expect(await decodeBothWays(await chain(source, [{ start: 0, end: 5 }]), prompts, 6)).toBeGreaterThan(0);
    expect(await decodeBothWays(await chain(source, [{ start: 0, end: 2 }, { start: 2, end: 5 }]), prompts, 6)).toBeGreaterThan(0);
  }, 60_000);

  it('with worker threads (the node default): the same bits', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const stages = await chain(source, [{ start: 0, end: 3 }, { start: 3, end: 5 }], () => createNodeCpuBackend({ threads: 2 }));
    expect(stages[0]!.threads).toBe(2);
    expect(await decodeBothWays(stages, STORY_PROMPTS.map((p) => p.map((t) => t % 512)), 4)).toBeGreaterThan(0);
  }, 60_000);

  const SYNTHETIC: Array<[string, MakeModelOptions]> = [
    ['gemma3 q8_0 (int8 weights, sliding window 4, soft cap)', { arch: 'gemma3', type: 'q8_0', layers: 3, embd: 128, heads: 4, kvHeads: 2, ffn: 256, vocab: 384, slidingWindow: 4, swaPattern: 2 }],
    ['qwen2moe f32 (biases, experts, shared expert)', { arch: 'qwen2moe', type: 'f32', layers: 2, embd: 64, heads: 4, kvHeads: 2, ffn: 96, vocab: 384 }],
    ['qwen3 q4_k (dequantised tiles, Q/K norms)', { arch: 'qwen3', type: 'q4_k', layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 384 }],
    ['llama f16, feed-forward of 70 (SwiGLU row by row)', { arch: 'llama', type: 'f16', layers: 2, embd: 64, heads: 4, kvHeads: 2, ffn: 70, vocab: 384 }],
    ['qwen35 f32 (Gated DeltaNet: rows one at a time)', { arch: 'qwen35', type: 'f32', layers: 4, embd: 64, heads: 4, kvHeads: 2, ffn: 128, vocab: 384 }],
  ];
  for (const [name, options] of SYNTHETIC) {
    it(`${name}: the same bits, split in two`, async () => {
      const source = await openTensorSource(await syntheticModel({ ctx: 256, seed: 3, ...options }));
      toClose.push(source);
      const n = options.layers!;
      const prompts = [[5, 6, 7], [9], [11, 12, 13, 14, 15, 16, 17], [20, 21]];
      expect(await decodeBothWays(await chain(source, [{ start: 0, end: 1 }, { start: 1, end: n }]), prompts, 7)).toBeGreaterThan(0);
    }, 60_000);
  }

  it('a batch that cannot run changes no session: a wrong position, a full context, a repeated session, a bad token', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [st] = await chain(source, [{ start: 0, end: 5 }]);
    await expectRefusedBatchesChangeNothing(st!);
  }, 60_000);
});
