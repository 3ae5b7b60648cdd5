// Batched decode on the WebGPU stage (forwardBatch) on Dawn in Node, SwiftShader here: sessions
// with different histories — one just opened (its first token comes in a batch), one deep in its
// context (past the first KV allocation, so its cache grows inside a batch) — decoded in one pass
// per stage give the same hidden states and logits, bit for bit, as each session decoded alone
// through `forward`: stories260K whole and split in two, with the software adapter's kernels and
// with the hardware ones (the workgroup-reduced mat-vec), and synthetic models for the other
// paths a row takes (GQA, an f16 cache, a cache split by heads, Q/K norms, int8 and
// dequantised-tile weights, biases, Qwen3.5's gated attention output, Gemma's sliding window and
// soft cap). A batch that cannot run changes no session; shards with experts or Gated DeltaNet
// layers offer no batches.
import { afterAll, describe, expect, it } from 'vitest';
import type { ShardRange } from '../src/backends/types.ts';
import type { WebGpuBackend } from '../src/backends/webgpu/backend.ts';
import { createNodeWebGpuBackend } from '../src/backends/webgpu/node.ts';
import type { WebGpuStageOptions } from '../src/backends/webgpu/stage.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { decodeBothWays, expectRefusedBatchesChangeNothing } from './support/batch-check.ts';
import { stories260K } from './support/models.ts';
import { syntheticModel } from './support/synthetic.ts';

const toClose: Array<WebGpuBackend | TensorSource> = [];
afterAll(async () => {
  for (const d of toClose.reverse()) await ('dispose' in d ? d.dispose() : d.close());
});

async function chain(source: TensorSource, ranges: ShardRange[], options: WebGpuStageOptions = {}): Promise<WebGpuBackend[]> {
  const stages: WebGpuBackend[] = [];
  for (const r of ranges) {
    const b = await createNodeWebGpuBackend(options);
    toClose.push(b);
    await b.load(source, r);
    stages.push(b);
  }
  return stages;
}

/** as test/webgpu-qwen35.test.ts: DeltaNet 0-2 (heads of 32, as the WGSL step needs), full attention on 3 */
const QWEN35: MakeModelOptions = { layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 384, linearKHeads: 2, linearVHeads: 4, linearHeadDim: 32 };

/**
 * a 255-token prompt: deep in its context, with more attention chunks than the others, and its
 * batched steps (the fifth session's: steps 0, 2, 3) reach position 256, past the KV cache's
 * first allocation, so its cache grows inside a batch
 */
const deepPrompt = (vocab: number): number[] => [1, ...Array.from({ length: 254 }, (_, i) => 2 + ((i * 37) % (vocab - 2)))];

describe('forwardBatch on the WebGPU stage (Dawn)', () => {
  const STORY_PROMPTS = [[1, 403, 407, 261, 378], [], [1, 365, 2354, 322, 4335, 3512, 304, 278], [1, 9038, 2501, 263, 931]];
  // (the hardware kernels' barriers are slow on SwiftShader: whole model only, fewer steps)
  // (the deep session, whose cache grows inside a batch, with the software kernels only: a 255-token prefill through the tiled kernel is most of a minute here)
  for (const [kernels, options, ranges, steps, deep] of [
    ['the software adapter\'s kernels, whole and split in two', {}, [[{ start: 0, end: 5 }], [{ start: 0, end: 2 }, { start: 2, end: 5 }]], 5, true],
    ['the hardware kernels (workgroup-reduced mat-vec, tiled prefill)', { matVec: 'mul_mat_vec', matMul: 'mul_mat_tiled' }, [[{ start: 0, end: 5 }]], 3, false],
  ] as Array<[string, WebGpuStageOptions, ShardRange[][], number, boolean]>) {
    it(`stories260K with ${kernels}: every step of every session the same bits as decoding it alone; refused batches change nothing`, async () => {
      const source = await openTensorSource(await stories260K());
      toClose.push(source);
      const vocab = configFromHeader(source.header).nVocab;
      const prompts = [...STORY_PROMPTS.map((p) => p.map((t) => t % vocab)), ...(deep ? [deepPrompt(vocab)] : [])];
      for (const r of ranges) {
        const stages = await chain(source, r, options);
        expect(await decodeBothWays(stages, prompts, steps)).toBeGreaterThan(0);
        // the deep session's cache grew (in a batch: its prefill ended at 255) past the others' first allocation
        if (deep) expect(stages[0]!.sessionStats('bat-4').kvBytes).toBeGreaterThan(stages[0]!.sessionStats('bat-0').kvBytes);
        // and on the whole model: batches that cannot run change no session
        if (stages.length === 1) await expectRefusedBatchesChangeNothing(stages[0]!);
      }
    }, 240_000);
  }

  const SYNTHETIC: Array<[string, MakeModelOptions, WebGpuStageOptions]> = [
    ['llama f32, GQA 4:2, an f16 cache split by heads', { arch: 'llama', type: 'f32', layers: 2, embd: 64, heads: 4, kvHeads: 2, ffn: 128, vocab: 384 }, { kvType: 'f16', maxKvBindingBytes: 16 * 16 * 2 }],
    ['qwen3 q4_k (dequantised tiles, Q/K norms), hardware kernels', { arch: 'qwen3', type: 'q4_k', layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 256, vocab: 384 }, { matVec: 'mul_mat_vec' }],
    ['qwen2 q8_0 (biases, int8 rounding)', { arch: 'qwen2', type: 'q8_0', layers: 2, embd: 64, heads: 4, kvHeads: 2, ffn: 128, vocab: 384 }, {}],
    ['qwen35 f32, the full-attention layer alone (gated attention output) after the DeltaNet ones', { ...QWEN35, arch: 'qwen35', type: 'f32' }, {}],
    ['gemma3 f16 (sliding window 4, soft cap)', { arch: 'gemma3', type: 'f16', layers: 3, embd: 64, heads: 4, kvHeads: 2, ffn: 128, vocab: 384, slidingWindow: 4, swaPattern: 2 }, {}],
  ];
  for (const [name, model, options] of SYNTHETIC) {
    it(`${name}: the same bits, split in two`, async () => {
      const source = await openTensorSource(await syntheticModel({ ctx: 512, seed: 3, ...model }));
      toClose.push(source);
      const n = model.layers!;
      const prompts = [[5, 6, 7], [], [11, 12, 13, 14, 15, 16, 17], [20, 21]];
      const split = model.arch === 'qwen35' ? n - 1 : 1; // qwen35: DeltaNet 0-2, full attention on 3
      expect(await decodeBothWays(await chain(source, [{ start: 0, end: split }, { start: split, end: n }], options), prompts, 6, 9)).toBeGreaterThan(0);
    }, 120_000);
  }

  it('shards with experts or Gated DeltaNet layers offer no batches (their steps run one by one)', async () => {
    for (const model of [
      { arch: 'qwen2moe', type: 'f32', layers: 2, embd: 64, heads: 4, kvHeads: 2, ffn: 96, vocab: 384 },
      { ...QWEN35, arch: 'qwen35', type: 'f32' },
    ] as MakeModelOptions[]) {
      const source = await openTensorSource(await syntheticModel({ ctx: 256, seed: 3, ...model }));
      toClose.push(source);
      const [st] = await chain(source, [{ start: 0, end: model.layers! }]);
      expect(st!.forwardBatch, model.arch).toBeUndefined();
    }
  }, 60_000);
});
