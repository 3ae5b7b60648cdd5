// Batched decode on llama.cpp layer ranges (LlamaCppRangeStage.forwardBatch): sessions of a
// stage are sequences of a pooled llama_context (src/backends/llamacpp/range-pool.ts), and the
// one-token steps of several go through one llama_decode. Against the same sessions decoded one
// by one on the same stages — stories260K split in three (stage 0, a middle stage, the last),
// synthetic Q8_0 and Q4_K models split in two, sessions at different positions, a varying
// subset batched each step — every hidden row and logit lies within the bounds below and every
// greedy token is the same. Not the same bits on F32 weights: ggml's F32 matmuls sum a batch of
// rows in another order than one row (quantised ones take each row on its own: 0 measured).
// Also: a session alone in a pool is a context of its own bit for bit, its pool grown under it
// (cells copied to a bigger context) or not; a session whose steps straddle the others (alone,
// batched, across growth); a pool emptied to a quarter shrinks to half, its sessions bit for bit;
// the batches a stage refuses change no session; and the pools' memory is what llama.cpp logged.
import { afterAll, describe, expect, it } from 'vitest';
import { restreamed } from '../src/backends/llamacpp/range-pool.ts';
import { LlamaCppRangeStage } from '../src/backends/llamacpp/range-stage.ts';
import type { BatchStep, HiddenRows, RowsForwardResult, ShardRange, StageInput } from '../src/backends/types.ts';
import { isMeshError } from '../src/errors.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { argmax } from '../src/model/sampler.ts';
import { decodeBothWays, expectRefusedBatchesChangeNothing, firstBitDifference, maxAbsDiff, values } from './support/batch-check.ts';
import type { Agreement } from './support/batch-check.ts';
import { stories260K } from './support/models.ts';
import { syntheticModel } from './support/synthetic.ts';

const OPTIONS = { threads: 1, kvType: 'f32', flashAttention: false } as const;

const toClose: Array<LlamaCppRangeStage | TensorSource> = [];
afterAll(async () => {
  for (const d of toClose.reverse()) await ('dispose' in d ? d.dispose() : d.close());
});

async function chain(source: TensorSource, ranges: ShardRange[], options = {}): Promise<LlamaCppRangeStage[]> {
  const stages: LlamaCppRangeStage[] = [];
  for (const r of ranges) {
    const b = new LlamaCppRangeStage({ ...OPTIONS, ...options });
    await b.load(source, r);
    toClose.push(b);
    stages.push(b);
  }
  return stages;
}

/** the bounds (max |Δ| batched vs one by one) and what each case saw */
const agreement = (logits: number, hidden: number): Agreement => ({ bound: { logits, hidden }, seen: { logits: 0, hidden: 0 } });
const seen: Record<string, Agreement['seen']> = {};
afterAll(() => console.log('llama.cpp batched vs one by one, max |Δ|:', JSON.stringify(seen)));

const STORY_PROMPTS = [[1, 403, 407, 261, 378], [1, 29871 % 512], [1, 365, 354, 322, 435, 351, 304, 278], [1, 90, 250, 263, 93], [1, 450]];

describe('forwardBatch on llama.cpp layer ranges', () => {
  it('stories260K in three stages: every row within the bounds of decoding it alone, the same greedy tokens', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const a = agreement(1e-4, 3e-5);
    expect(await decodeBothWays(await chain(source, [{ start: 0, end: 2 }, { start: 2, end: 4 }, { start: 4, end: 5 }]), STORY_PROMPTS, 8, 1, a)).toBeGreaterThan(0);
    seen.stories260K = a.seen;
  }, 60_000);

  for (const type of ['q8_0', 'q4_k'] as const) {
    it(`synthetic llama ${type}, split in two: within the bounds, the same greedy tokens`, async () => {
      const source = await openTensorSource(await syntheticModel({ arch: 'llama', type, layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 384, ctx: 256, seed: 5 }));
      toClose.push(source);
      const a = agreement(1e-5, 1e-5);
      const prompts = [[5, 6, 7], [9], [11, 12, 13, 14, 15, 16, 17], [20, 21]];
      expect(await decodeBothWays(await chain(source, [{ start: 0, end: 1 }, { start: 1, end: 2 }]), prompts, 7, 1, a)).toBeGreaterThan(0);
      seen[type] = a.seen;
    }, 60_000);
  }

  it('a session alone in a pool is a context of its own, bit for bit, before and after its pool grows', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [[lone], [shared]] = [await chain(source, [{ start: 0, end: 5 }]), await chain(source, [{ start: 0, end: 5 }])];
    const logits = async (st: LlamaCppRangeStage, id: string, tokens: number[]) => values(await st.forward(id, { kind: 'tokens', tokens: Int32Array.from(tokens) }, st.sessionStats(id).position));
    await lone!.openSession('a', { contextLength: 64 });
    await shared!.openSession('a', { contextLength: 64 });
    const prompt = [1, 403, 407, 261, 378];
    expect(firstBitDifference(await logits(shared!, 'a', prompt), await logits(lone!, 'a', prompt))).toBe(-1);
    // b and c join: the pool is remade twice (two, then four sequences), a's cells copied each time
    for (const [id, p] of [['b', [1, 90, 250]], ['c', [1, 450, 93, 12, 7, 8, 9]]] as const) {
      await shared!.openSession(id, { contextLength: 64 });
      await logits(shared!, id, [...p]);
      for (const t of [11, 12]) expect(firstBitDifference(await logits(shared!, 'a', [t]), await logits(lone!, 'a', [t]))).toBe(-1);
    }
    expect(shared!.poolStats.map((p) => [p.slots, p.used])).toEqual([[4, 3]]);
    // a's rollback in the pool is a rollback of its own context
    shared!.rollbackSession('a', 6);
    lone!.rollbackSession('a', 6);
    expect(firstBitDifference(await logits(shared!, 'a', [30, 31]), await logits(lone!, 'a', [30, 31]))).toBe(-1);
  }, 60_000);

  it('a batch whose sessions skip a few sequences is one graph (placeholder rows), and the skipped sessions go on as contexts of their own', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [[lone], [pool]] = [await chain(source, [{ start: 0, end: 3 }]), await chain(source, [{ start: 0, end: 3 }])];
    const ids = ['s0', 's1', 's2', 's3', 's4', 's5', 's6'];
    for (const [i, id] of ids.entries()) {
      await pool!.openSession(id, { contextLength: 64 });
      await pool!.forward(id, { kind: 'tokens', tokens: Int32Array.of(1, 30 + i, 40 + i) }, 0);
    }
    expect(pool!.poolStats.map((p) => [p.slots, p.used])).toEqual([[8, 7]]);
    await lone!.openSession('s1', { contextLength: 64 });
    await lone!.forward('s1', { kind: 'tokens', tokens: Int32Array.of(1, 31, 41) }, 0);
    const oneGraph = () => pool!.nodesOffered('s0');
    await pool!.forward('s0', { kind: 'tokens', tokens: Int32Array.of(5) }, 3);
    const graph = oneGraph();
    const batch = (which: string[]) => pool!.forwardBatch(which.map((id) => ({ sessionId: id, input: { kind: 'tokens', tokens: Int32Array.of(9) }, position: pool!.sessionStats(id).position, outDtype: 'f32' })));
    await batch(['s0', 's2', 's3']); // s1 skipped: a placeholder in its sequence
    expect(oneGraph()).toBe(graph);
    await pool!.releaseSession('s4');
    await batch(['s3', 's5']); // s4's sequence free: a placeholder there too
    expect(oneGraph()).toBe(graph);
    await batch(['s0', 's6']); // five sequences between them: two graphs
    expect(oneGraph()).toBe(2 * graph);
    // s1 was skipped by a batch, and goes on as a context of its own
    const step = async (st: LlamaCppRangeStage) => values(await st.forward('s1', { kind: 'tokens', tokens: Int32Array.of(7) }, 3));
    expect(firstBitDifference(await step(pool!), await step(lone!))).toBe(-1);
    expect(pool!.sessionStats('s1').position).toBe(4);
  }, 60_000);

  it('a pool a quarter used is remade with half its sequences as sessions leave, the rest moved to the lowest, bit for bit', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [[lone], [pool]] = [await chain(source, [{ start: 0, end: 5 }]), await chain(source, [{ start: 0, end: 5 }])];
    const logits = async (st: LlamaCppRangeStage, id: string, tokens: number[]) => values(await st.forward(id, { kind: 'tokens', tokens: Int32Array.from(tokens) }, st.sessionStats(id).position));
    const ids = ['s0', 's1', 's2', 's3', 's4', 's5', 's6', 's7'];
    const prompt = (i: number) => [1, 30 + i, 40 + i, 50 + i];
    for (const [i, id] of ids.entries()) {
      await pool!.openSession(id, { contextLength: 64 });
      await logits(pool!, id, prompt(i));
    }
    expect(pool!.poolStats.map((p) => [p.slots, p.used])).toEqual([[8, 8]]);
    // the two that stay, each also in a stage of their own (a pool of two: each sequence its own stream)
    for (const i of [5, 7]) {
      await lone!.openSession(ids[i]!, { contextLength: 64 });
      await logits(lone!, ids[i]!, prompt(i));
    }
    for (const id of ['s0', 's1', 's2', 's3']) await pool!.releaseSession(id);
    expect(pool!.poolStats.map((p) => [p.slots, p.used])).toEqual([[8, 4]]); // half used: kept
    const before = pool!.sessionBytes;
    await pool!.releaseSession('s4');
    await pool!.releaseSession('s6');
    // a quarter used: remade with four sequences, s5 and s7 in the first two; then a third left in use is not a quarter of four
    expect(pool!.poolStats.map((p) => [p.slots, p.used])).toEqual([[4, 2]]);
    expect(pool!.sessionBytes).toBeLessThan(before);
    for (const t of [11, 12, 13]) for (const id of ['s5', 's7']) expect(firstBitDifference(await logits(pool!, id, [t]), await logits(lone!, id, [t])), `${id} after the move`).toBe(-1);
    expect(pool!.sessionStats('s7').position).toBe(7);
    // their steps batch as one graph again, and a newcomer takes the free sequence after them
    const graph = pool!.nodesOffered('s5');
    const batch = (st: LlamaCppRangeStage) => st.forwardBatch(['s5', 's7'].map((id) => ({ sessionId: id, input: { kind: 'tokens', tokens: Int32Array.of(9) }, position: st.sessionStats(id).position, outDtype: 'f32' })));
    const [inPool, alone] = [await batch(pool!), await batch(lone!)]; // the same two rows in one graph each
    expect(pool!.nodesOffered('s5')).toBe(graph);
    for (const i of [0, 1]) expect(firstBitDifference(values(inPool[i]!), values(alone[i]!))).toBe(-1);
    await pool!.openSession('s8', { contextLength: 64 });
    expect(pool!.poolStats.map((p) => [p.slots, p.used])).toEqual([[4, 3]]);
    // the last two leave one of four: a pool of two, then of one, then none
    await pool!.releaseSession('s8');
    await pool!.releaseSession('s5');
    expect(pool!.poolStats.map((p) => [p.slots, p.used])).toEqual([[2, 1]]);
    expect(firstBitDifference(await logits(pool!, 's7', [20]), await logits(lone!, 's7', [20]))).toBe(-1);
    await pool!.releaseSession('s7');
    expect(pool!.poolStats).toEqual([]);
  }, 60_000);

  it("rewrites a sequence's saved state for a cache of another stream count, and refuses bytes laid out otherwise", () => {
    const u32 = (...xs: number[]) => new Uint8Array(Uint32Array.from(xs).buffer);
    const cat = (...parts: Uint8Array[]) => Uint8Array.from(parts.flatMap((p) => [...p]));
    const head = u32(0x67676d6c, 1); // magic, seq_id 1
    // saved from two streams, the sequence's cells in stream 1: (3 cells, their bytes)
    const cells = cat(u32(3), Uint8Array.of(9, 8, 7, 6, 5));
    expect(restreamed(cat(head, u32(2), u32(0), cells), 4)).toEqual(cat(head, u32(4), cells, u32(0, 0, 0)));
    expect(restreamed(cat(head, u32(2), cells, u32(0)), 1)).toEqual(cat(head, u32(1), cells));
    expect(restreamed(cat(head, u32(3), u32(0, 0, 0)), 8)).toBeNull(); // no cells: nothing to copy
    expect(restreamed(cat(head, u32(2), cells, u32(7)), 4)).toBe('unknown'); // what follows is not an empty stream
    expect(restreamed(cat(head, u32(0)), 4)).toBe('unknown');
    expect(restreamed(head, 4)).toBe('unknown');
  });

  it('a session whose steps straddle the others: alone, in batches, across a pool that grows under it', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const ranges = [{ start: 0, end: 3 }, { start: 3, end: 5 }];
    const [alone, batched] = [await chain(source, ranges), await chain(source, ranges)];
    const step = async (stages: LlamaCppRangeStage[], ids: string[], tokens: number[][], batch: boolean): Promise<Float32Array[]> => {
      let inputs: Array<StageInput | HiddenRows> = tokens.map((t) => ({ kind: 'tokens', tokens: Int32Array.from(t) }));
      let outs: RowsForwardResult[] = [];
      for (const st of stages) {
        const pos = ids.map((id) => st.sessionStats(id).position);
        const one = (id: string, i: number) => st.forwardRows(id, inputs[i]!, pos[i]!, 'f32');
        outs = batch ? await st.forwardBatch(ids.map((sessionId, i): BatchStep => ({ sessionId, input: inputs[i]!, position: pos[i]!, outDtype: 'f32' }))) : await Promise.all(ids.map(one));
        inputs = outs.map((o) => o.output as HiddenRows);
      }
      return outs.map(values);
    };
    const open = async (stages: LlamaCppRangeStage[], id: string) => {
      for (const st of stages) await st.openSession(id, { contextLength: 64 });
    };
    let worst = 0;
    const both = async (ids: string[], tokens: number[][], batch: boolean) => {
      const ref: Float32Array[] = [];
      for (const [i, id] of ids.entries()) ref.push(...(await step(alone, [id], [tokens[i]!], false)));
      const got = await step(batched, ids, tokens, batch);
      for (const [i, r] of ref.entries()) {
        worst = Math.max(worst, maxAbsDiff(r, got[i]!));
        expect(argmax(got[i]!)).toBe(argmax(r));
      }
      return ref.map(argmax);
    };
    // s prefills alone in a pool of one; t joins (the pool grows to two, s's cells move), u too (four)
    for (const stages of [alone, batched]) await open(stages, 's');
    let [s] = await both(['s'], [[1, 403, 407, 261, 378]], false);
    for (const stages of [alone, batched]) await open(stages, 't');
    let [t] = await both(['t'], [[1, 90, 250]], false);
    expect(batched[0]!.poolStats.map((p) => [p.slots, p.used])).toEqual([[2, 2]]);
    [s, t] = await both(['s', 't'], [[s!], [t!]], true);
    [s] = await both(['s'], [[s!]], false); // s alone between batches
    const oneGraph = batched[0]!.nodesOffered('s'); // graph nodes the eval callback saw for one step's graph
    for (const stages of [alone, batched]) await open(stages, 'u');
    let [u] = await both(['u'], [[1, 450, 93, 12]], false);
    expect(batched[1]!.poolStats.map((p) => [p.slots, p.used])).toEqual([[4, 3]]);
    for (let i = 0; i < 3; i++) [s, t, u] = await both(['s', 't', 'u'], [[s!], [t!], [u!]], true);
    // three sessions in consecutive sequences: one graph for the three rows
    expect(batched[0]!.nodesOffered('s')).toBe(oneGraph);
    [t, u] = await both(['t', 'u'], [[t!], [u!]], true);
    expect(batched.map((st) => ['s', 't', 'u'].map((id) => st.sessionStats(id).position))).toEqual([[10, 8, 8], [10, 8, 8]]);
    expect(worst).toBeLessThanOrEqual(1e-4);
    seen.straddle = { logits: worst, hidden: 0 };
  }, 60_000);

  it('a batch that cannot run changes no session: a wrong position, a full context, a repeated session, two tokens, an unknown session, a bad token, hidden states on stage 0', async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [b] = await chain(source, [{ start: 0, end: 5 }]);
    await expectRefusedBatchesChangeNothing(b!, 1e-4);
    const hidden: StageInput = { kind: 'hidden', hidden: new Float32Array(64), nTokens: 1 };
    const e = await b!.forwardBatch([{ sessionId: 'a', input: hidden, position: 4, outDtype: 'f32' }]).catch((x: unknown) => x);
    expect(isMeshError(e) && e.code).toBe('BAD_STAGE_INPUT');
    expect(b!.sessionStats('a').position).toBe(4);
  }, 60_000);

  it("pools hold what llama.cpp logged; a budget too small to grow a pool gives a session one of its own, and batches span both", async () => {
    const source = await openTensorSource(await stories260K());
    toClose.push(source);
    const [probe] = await chain(source, [{ start: 2, end: 5 }]);
    await probe!.openSession('p', { contextLength: 256 });
    const one = probe!.sessionBytes;
    const kv = probe!.sessionStats('p').kvBytes;
    await probe!.openSession('q', { contextLength: 200 }); // the same 256 cells: the pool grows to two
    const [pool] = probe!.poolStats;
    expect([pool!.slots, pool!.used, pool!.cells]).toEqual([2, 2, 256]);
    // llama.cpp's own log of the KV buffer (to 0.01 MiB) is two sequences' cells
    expect(Math.abs(pool!.buffers.KV! - 2 * kv)).toBeLessThanOrEqual(0.01 * 2 ** 20);
    expect(probe!.sessionBytes).toBe(2 * kv + pool!.buffers.compute! + pool!.buffers.output!);
    await probe!.releaseSession('p');
    await probe!.releaseSession('q');
    expect(probe!.poolStats).toEqual([]); // an emptied pool is freed
    expect(probe!.sessionBytes).toBe(0);

    // room for two pools of one, not for a pool of two beside the first
    const [st] = await chain(source, [{ start: 2, end: 5 }], { memoryBytes: probe!.shardBytes + 2 * one + kv / 2 });
    for (const id of ['a', 'b']) await st!.openSession(id, { contextLength: 256 });
    expect(st!.poolStats.map((p) => [p.slots, p.used])).toEqual([[1, 1], [1, 1]]);
    expect(await st!.openSession('c', { contextLength: 256 }).catch((e: unknown) => isMeshError(e) && e.code)).toBe('STAGE_MEMORY_FULL');
    const h = (v: number): StageInput => ({ kind: 'hidden', hidden: new Float32Array(64).fill(v), nTokens: 1 });
    const out = await st!.forwardBatch([{ sessionId: 'a', input: h(0.1), position: 0, outDtype: 'f32' }, { sessionId: 'b', input: h(0.2), position: 0, outDtype: 'f32' }]);
    await probe!.openSession('a', { contextLength: 256 });
    await probe!.openSession('b', { contextLength: 256 });
    expect(maxAbsDiff(values(out[0]!), values(await probe!.forward('a', h(0.1), 0)))).toBeLessThanOrEqual(1e-4);
    expect(maxAbsDiff(values(out[1]!), values(await probe!.forward('b', h(0.2), 0)))).toBeLessThanOrEqual(1e-4);
    expect(st!.sessionStats('b').position).toBe(1);
  }, 60_000);
});
