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
import type { ForwardResult, RowsForwardResult, ShardRange, StageInput } from '../src/backends/types.ts';
import { isMeshError } from '../src/errors.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { argmax } from '../src/model/sampler.ts';
import { stories260K } from './support/models.ts';
import { syntheticModel } from './support/synthetic.ts';

const toClose: Array<{ dispose(): Promise<void> } | TensorSource> = [];
afterAll(async () => {
  for (const d of toClose.reverse()) await ('dispose' in d ? d.dispose() : d.close());
});

/** index of the first element whose bits differ, -1 when none (lengths must match) */
function firstBitDifference(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return 0;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

function values(r: ForwardResult | RowsForwardResult): Float32Array {
  if (r.output.kind === 'logits') return r.output.logits;
  if (r.output.kind === 'hidden') return r.output.hidden;
  throw new Error('the CPU engine answers f32');
}

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

/**
 * Opens `ref-i` and `bat-i` for each prompt on every stage, prefills both, then decodes
 * `steps` greedy steps: the ref sessions one by one through `forward`, the bat sessions in one
 * forwardBatch per stage (a varying subset each step, so positions drift apart). Every stage's
 * output must match bit for bit. Returns how many rows went through batches.
 */
async function decodeBothWays(stages: CpuBackend[], prompts: number[][], steps: number): Promise<number> {
  const ctx = Math.max(...prompts.map((p) => p.length)) + steps + 1;
  const next: number[] = [];
  for (const [i, p] of prompts.entries()) {
    for (const id of [`ref-${i}`, `bat-${i}`]) {
      let input: StageInput = { kind: 'tokens', tokens: Int32Array.from(p) };
      for (const st of stages) {
        await st.openSession(id, { contextLength: ctx });
        const out: ForwardResult['output'] = (await st.forward(id, input, 0)).output;
        input = out.kind === 'hidden' ? out : input;
        if (out.kind === 'logits') next[i] = argmax(out.logits);
      }
    }
  }
  let batched = 0;
  for (let step = 0; step < steps; step++) {
    const active = prompts.map((_, i) => i).filter((i) => (i + step) % 3 !== 2 || prompts.length === 1);
    const pos = (i: number) => stages[0]!.sessionStats(`ref-${i}`).position;
    let refIn: StageInput[] = active.map((i) => ({ kind: 'tokens', tokens: Int32Array.of(next[i]!) }));
    let batIn: StageInput[] = refIn;
    let last: ForwardResult[] = [];
    const positions = active.map(pos);
    for (const [s, st] of stages.entries()) {
      const ref: ForwardResult[] = [];
      for (const [j, i] of active.entries()) ref.push(await st.forward(`ref-${i}`, refIn[j]!, positions[j]!));
      const bat = await st.forwardBatch(active.map((i, j) => ({ sessionId: `bat-${i}`, input: batIn[j]!, position: positions[j]!, outDtype: 'f32' as const })));
      expect(bat).toHaveLength(active.length);
      for (const [j, i] of active.entries()) {
        expect(firstBitDifference(values(ref[j]!), values(bat[j]!)), `stage ${s}, session ${i}, position ${positions[j]}`).toBe(-1);
        expect(st.sessionStats(`bat-${i}`)).toEqual(st.sessionStats(`ref-${i}`));
      }
      // a stage's hidden states are the next stage's input
      refIn = ref.map((r) => r.output as StageInput);
      batIn = bat.map((r) => r.output as StageInput);
      last = ref;
      batched += active.length;
    }
    for (const [j, i] of active.entries()) next[i] = argmax(values(last[j]!));
  }
  return batched;
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

  it('a batch that cannot run changes no session: a wrong position, a full context, a repeated session', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [st] = await chain(source, [{ start: 0, end: 5 }]);
    const b = st!;
    await b.openSession('a', { contextLength: 16 });
    await b.openSession('full', { contextLength: 4 });
    await b.forward('a', { kind: 'tokens', tokens: Int32Array.of(1, 2, 3) }, 0);
    await b.forward('full', { kind: 'tokens', tokens: Int32Array.of(1, 2, 3, 4) }, 0);
    const tok = (t: number): StageInput => ({ kind: 'tokens', tokens: Int32Array.of(t) });
    const refuse = async (steps: Parameters<CpuBackend['forwardBatch']>[0], code: string) => {
      const e = await b.forwardBatch(steps).catch((x: unknown) => x);
      expect(isMeshError(e) && e.code, String(e)).toBe(code);
      expect(b.sessionStats('a').position).toBe(3);
      expect(b.sessionStats('full').position).toBe(4);
    };
    await refuse([{ sessionId: 'a', input: tok(5), position: 3, outDtype: 'f32' }, { sessionId: 'full', input: tok(5), position: 3, outDtype: 'f32' }], 'POSITION_MISMATCH');
    await refuse([{ sessionId: 'a', input: tok(5), position: 3, outDtype: 'f32' }, { sessionId: 'full', input: tok(5), position: 4, outDtype: 'f32' }], 'CONTEXT_FULL');
    await refuse([{ sessionId: 'a', input: tok(5), position: 3, outDtype: 'f32' }, { sessionId: 'a', input: tok(6), position: 3, outDtype: 'f32' }], 'BAD_STAGE_INPUT');
    await refuse([{ sessionId: 'a', input: { kind: 'tokens', tokens: Int32Array.of(5, 6) }, position: 3, outDtype: 'f32' }], 'BAD_STAGE_INPUT');
    // after the refusals the session decodes as one that never saw them
    await b.openSession('fresh', { contextLength: 16 });
    await b.forward('fresh', { kind: 'tokens', tokens: Int32Array.of(1, 2, 3) }, 0);
    const [again] = await b.forwardBatch([{ sessionId: 'a', input: tok(5), position: 3, outDtype: 'f32' }]);
    const alone = await b.forward('fresh', tok(5), 3);
    expect(firstBitDifference(values(again!), values(alone))).toBe(-1);
  }, 60_000);
});
