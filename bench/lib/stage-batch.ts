// A stage's batched decode in one process, without a route: one stage holding the whole model,
// as many sessions as the largest batch, each prefilled with a prompt of its own length.
// Baseline, in the same run: ms of one session's decode step alone (`forward`). Then for each
// batch size B: ms of one forwardBatch of B sessions' steps, and per row (÷ B); `speedup` =
// alone ms ÷ per-row ms. The levels run side by side `rounds` times (1, 8, 32, 1, 8, 32, …),
// each level's batches after one step alone, and each figure is the median. Before that, each
// level's batch is checked: its sessions are rewound (truncateSession) and the same steps run
// alone; `identical` says every row had the same bits, `max_abs_diff` how far the farthest
// value lay. The WebGPU (./webgpu-batch.ts) and llama.cpp (../batch.ts) benches run it.

import type { ForwardResult, RowsForwardResult, StageBackend, StageInput } from '../../src/backends/types.ts';
import { median } from '../../src/stats.ts';
import { round2 } from './goals.ts';

export interface BatchLevelFigure {
  rows: number;
  ms_per_batch: number;
  ms_per_row: number;
  /** alone ms ÷ ms per row */
  speedup: number;
  identical: boolean;
  max_abs_diff: number;
}

export interface StageBatchFigure {
  sessions: number;
  /** the baseline: one session's decode step alone */
  ms_per_step_alone: number;
  levels: BatchLevelFigure[];
}

const tok = (t: number): StageInput => ({ kind: 'tokens', tokens: Int32Array.of(t) });
const floats = ({ output: o }: ForwardResult | RowsForwardResult): Float32Array => {
  if (o.kind === 'logits') return o.logits;
  if (o.kind === 'hidden') return o.hidden;
  return new Float32Array(o.bytes.buffer, o.bytes.byteOffset, o.bytes.byteLength / 4);
};

/** Sessions s-0 … s-(n-1), each prefilled with 4 + 2·i tokens; their positions */
async function openSessions(stage: StageBackend, n: number, vocab: number, ctx: number): Promise<number[]> {
  const at: number[] = [];
  for (let i = 0; i < n; i++) {
    const prompt = Int32Array.from({ length: 4 + 2 * i }, (_, j) => (j === 0 ? 1 : 2 + ((i * 31 + j * 7) % (vocab - 2))));
    await stage.openSession(`s-${i}`, { contextLength: ctx });
    await stage.forward(`s-${i}`, { kind: 'tokens', tokens: prompt }, 0);
    at.push(prompt.length);
  }
  return at;
}

/** The figures of `stage` (loaded with the whole model, offering forwardBatch, no sessions yet). */
export async function stageBatchFigure(stage: StageBackend, vocab: number, levels: number[], rounds: number): Promise<StageBatchFigure> {
  if (!stage.forwardBatch) throw new Error("this model's stage offers no batches");
  const sessions = Math.max(...levels);
  const steps = 2; // per level per round
  const at = await openSessions(stage, sessions, vocab, 4 + 2 * sessions + levels.length * (1 + rounds * (1 + steps)) + 8);
  const batch = async (b: number): Promise<Array<ForwardResult | RowsForwardResult>> => {
    const out = await stage.forwardBatch!(Array.from({ length: b }, (_, i) => ({ sessionId: `s-${i}`, input: tok(7), position: at[i]!, outDtype: 'f32' as const })));
    for (let i = 0; i < b; i++) at[i]! += 1;
    return out;
  };
  const checked = new Map<number, { identical: boolean; max_abs_diff: number }>();
  for (const b of levels) {
    const out = await batch(b);
    let identical = true;
    let diff = 0;
    for (let i = 0; i < b; i++) {
      await stage.truncateSession(`s-${i}`, at[i]! - 1);
      const [x, y] = [floats(await stage.forward(`s-${i}`, tok(7), at[i]! - 1)), floats(out[i]!)];
      const [xb, yb] = [new Uint32Array(x.buffer, x.byteOffset, x.length), new Uint32Array(y.buffer, y.byteOffset, y.length)];
      for (let j = 0; j < x.length; j++) {
        identical &&= xb[j] === yb[j];
        diff = Math.max(diff, Math.abs(x[j]! - y[j]!));
      }
    }
    checked.set(b, { identical, max_abs_diff: diff });
  }
  const alone: number[] = [];
  const perBatch = new Map<number, number[]>(levels.map((b) => [b, []]));
  // the baseline beside every level: one step alone, then the level's batches
  for (let round = 0; round < rounds; round++) {
    for (const b of levels) {
      const t0 = performance.now();
      await stage.forward('s-0', tok(7), at[0]!);
      alone.push(performance.now() - t0);
      at[0]! += 1;
      for (let s = 0; s < steps; s++) {
        const t1 = performance.now();
        await batch(b);
        perBatch.get(b)!.push(performance.now() - t1);
      }
    }
  }
  const aloneMs = median(alone);
  return {
    sessions,
    ms_per_step_alone: round2(aloneMs),
    levels: levels.map((b) => {
      const ms = median(perBatch.get(b)!);
      return { rows: b, ms_per_batch: round2(ms), ms_per_row: round2(ms / b), speedup: round2(aloneMs / (ms / b)), ...checked.get(b)! };
    }),
  };
}
