// What the batched-decode tests of every engine share (test/cpu-batch.test.ts,
// test/webgpu-batch.test.ts, test/browser/*-worker-batch.test.ts): decoding sessions both ways —
// one by one through `forward`, and in one `forwardBatch` per stage — and checking every
// stage's output bit for bit; and the batches a stage must refuse without changing a session.
// No Node imports: the browser tests use it too.
import { expect } from 'vitest';
import type { BatchStep, ForwardResult, RowsForwardResult, StageBackend, StageInput } from '../../src/backends/types.ts';
import { isMeshError } from '../../src/errors.ts';
import { argmax } from '../../src/model/sampler.ts';

/** index of the first element whose bits differ, -1 when none (0 when the lengths differ) */
export function firstBitDifference(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return 0;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

export function values(r: ForwardResult | RowsForwardResult): Float32Array {
  if (r.output.kind === 'logits') return r.output.logits;
  if (r.output.kind === 'hidden') return r.output.hidden;
  if (r.output.dtype === 'f32') return new Float32Array(r.output.bytes.buffer, r.output.bytes.byteOffset, r.output.bytes.byteLength / 4);
  throw new Error('expected f32 outputs');
}

/** max |a[i] - b[i]| */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} != ${b.length}`);
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

/** How far batched outputs may lie from one-by-one ones (max |Δ|), and how far they were seen to. */
export interface Agreement {
  bound: { logits: number; hidden: number };
  seen: { logits: number; hidden: number };
}

/**
 * Opens `ref-i` and `bat-i` for each prompt on every stage and prefills both (an empty prompt:
 * the session is just opened, its first token — `firstToken` — comes in a batch), then decodes
 * `steps` greedy steps: the ref sessions one by one through `forward`, the bat sessions in one
 * forwardBatch per stage (a varying subset each step, so positions drift apart; a stage that
 * offers no batches runs them alone, as the stage service does). Every stage's output must
 * match bit for bit (or, given `within`, lie within its bound and give the same greedy tokens),
 * and so must the sessions' stats. Returns the rows that went through batches.
 */
export async function decodeBothWays(stages: StageBackend[], prompts: number[][], steps: number, firstToken = 1, within?: Agreement): Promise<number> {
  const ctx = Math.max(...prompts.map((p) => p.length)) + steps + 1;
  const next = prompts.map(() => firstToken);
  // all bat sessions first: an engine whose sessions are sequences numbered as they open
  // (llama.cpp's pools) then has them consecutive, as its batches want them
  for (const kind of ['bat', 'ref']) {
    for (const [i, p] of prompts.entries()) {
      const id = `${kind}-${i}`;
      let input: StageInput = { kind: 'tokens', tokens: Int32Array.from(p) };
      for (const st of stages) {
        await st.openSession(id, { contextLength: ctx });
        if (p.length === 0) continue;
        const out: ForwardResult['output'] = (await st.forward(id, input, 0)).output;
        input = out.kind === 'hidden' ? out : input;
        if (out.kind === 'logits') next[i] = argmax(out.logits);
      }
    }
  }
  let batched = 0;
  for (let step = 0; step < steps; step++) {
    const active = prompts.map((_, i) => i).filter((i) => (i + step) % 3 !== 2 || prompts.length === 1);
    const positions = active.map((i) => stages[0]!.sessionStats(`ref-${i}`).position);
    let refIn: StageInput[] = active.map((i) => ({ kind: 'tokens', tokens: Int32Array.of(next[i]!) }));
    let batIn: StageInput[] = refIn;
    let last: ForwardResult[] = [];
    for (const [s, st] of stages.entries()) {
      const ref: ForwardResult[] = [];
      for (const [j, i] of active.entries()) ref.push(await st.forward(`ref-${i}`, refIn[j]!, positions[j]!));
      const bat = st.forwardBatch
        ? ((await st.forwardBatch(active.map((i, j) => ({ sessionId: `bat-${i}`, input: batIn[j]!, position: positions[j]!, outDtype: 'f32' as const })))) as ForwardResult[])
        : await Promise.all(active.map((i, j) => st.forward(`bat-${i}`, batIn[j]!, positions[j]!)));
      if (st.forwardBatch) batched += active.length;
      expect(bat).toHaveLength(active.length);
      for (const [j, i] of active.entries()) {
        const where = `stage ${s}, session ${i}, position ${positions[j]}`;
        if (within) {
          // an engine whose batches are not the same bits: within the bound, the same greedy token
          const kind = ref[j]!.output.kind === 'logits' ? 'logits' : 'hidden';
          const d = maxAbsDiff(values(ref[j]!), values(bat[j]!));
          within.seen[kind] = Math.max(within.seen[kind], d);
          expect(d, where).toBeLessThanOrEqual(within.bound[kind]);
          if (kind === 'logits') expect(argmax(values(bat[j]!)), where).toBe(argmax(values(ref[j]!)));
        } else expect(firstBitDifference(values(ref[j]!), values(bat[j]!)), where).toBe(-1);
        expect(st.sessionStats(`bat-${i}`)).toEqual(st.sessionStats(`ref-${i}`));
      }
      // a stage's hidden states are the next stage's input
      refIn = ref.map((r) => r.output as StageInput);
      batIn = bat.map((r) => r.output as StageInput);
      last = ref;
    }
    for (const [j, i] of active.entries()) next[i] = argmax(values(last[j]!));
  }
  return batched;
}

/**
 * On `b` (the whole stories260K, no sessions yet): batches that cannot run — a wrong position,
 * a full context, a repeated session, two tokens, an unknown session, a token outside the
 * vocabulary — are refused with their codes and change no session; afterwards a session decodes
 * as one that never saw them (bit for bit, or within `bound` and the same greedy token).
 */
export async function expectRefusedBatchesChangeNothing(b: StageBackend, bound?: number): Promise<void> {
  const batch = b.forwardBatch!.bind(b);
  await b.openSession('a', { contextLength: 16 });
  await b.openSession('full', { contextLength: 4 });
  await b.forward('a', { kind: 'tokens', tokens: Int32Array.of(1, 2, 3) }, 0);
  await b.forward('full', { kind: 'tokens', tokens: Int32Array.of(1, 2, 3, 4) }, 0);
  const tok = (t: number): StageInput => ({ kind: 'tokens', tokens: Int32Array.of(t) });
  const step = (sessionId: string, input: StageInput, position: number): BatchStep => ({ sessionId, input, position, outDtype: 'f32' });
  const refuse = async (steps: BatchStep[], code: string) => {
    const e = await batch(steps).catch((x: unknown) => x);
    expect(isMeshError(e) && e.code, String(e)).toBe(code);
    expect(b.sessionStats('a').position).toBe(3);
    expect(b.sessionStats('full').position).toBe(4);
  };
  await refuse([step('a', tok(5), 3), step('full', tok(5), 3)], 'POSITION_MISMATCH');
  await refuse([step('a', tok(5), 3), step('full', tok(5), 4)], 'CONTEXT_FULL');
  await refuse([step('a', tok(5), 3), step('a', tok(6), 3)], 'BAD_STAGE_INPUT');
  await refuse([step('a', { kind: 'tokens', tokens: Int32Array.of(5, 6) }, 3)], 'BAD_STAGE_INPUT');
  await refuse([step('a', tok(5), 3), step('nobody', tok(5), 0)], 'SESSION_UNKNOWN');
  await refuse([step('a', tok(1 << 20), 3)], 'BAD_TOKEN');
  await b.openSession('fresh', { contextLength: 16 });
  await b.forward('fresh', { kind: 'tokens', tokens: Int32Array.of(1, 2, 3) }, 0);
  const [again] = await batch([step('a', tok(5), 3)]);
  const alone = await b.forward('fresh', tok(5), 3);
  if (bound === undefined) expect(firstBitDifference(values(again!), values(alone))).toBe(-1);
  else {
    expect(maxAbsDiff(values(again!), values(alone))).toBeLessThanOrEqual(bound);
    expect(argmax(values(again!))).toBe(argmax(values(alone)));
  }
}
