// A native node's llama.cpp stages run in a worker thread (workers/stage-thread.ts), as its CPU
// engine does, because llama_decode is synchronous: on the node's own thread a long prefill
// held its event loop, and the server's heartbeat (a node silent for 3.5 s is lost) with it.
// Here a layer range's prefill long enough to take a while runs in the thread while this
// thread's timers are watched; the same call on the stage in this thread stalls them for as
// long as it computes (so the check can fail). Both give the same bytes: rows out of stage 0,
// logits out of the last stage fed those rows, and the whole-model stage's logits on
// stories260K; so do batched steps of concurrent sessions (forwardBatch). Error codes cross the
// thread; a thread that dies fails calls with its code.
import { afterAll, describe, expect, it } from 'vitest';
import { LlamaCppRangeStage } from '../src/backends/llamacpp/range-stage.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import type { BatchStep, HiddenRows, RowsForwardResult, StageBackend } from '../src/backends/types.ts';
import { MeshError } from '../src/errors.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { stageBackendInThread, stageThread } from '../workers/stage-thread.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';
import { longestStall } from './support/stall.ts';
import { syntheticModel } from './support/synthetic.ts';

const opened: Array<StageBackend | TensorSource> = [];
const kept = <T extends StageBackend | TensorSource>(x: T): T => (opened.push(x), x);
afterAll(async () => {
  for (const x of opened.reverse()) await ('dispose' in x ? x.dispose() : x.close());
});

const OPTIONS = { threads: 1, kvType: 'f32', flashAttention: false } as const;
const rowsOf = (r: RowsForwardResult): HiddenRows => {
  if (r.output.kind !== 'rows') throw new Error('a stage without the head answers hidden rows');
  return r.output;
};
const logitsOf = (r: RowsForwardResult): Float32Array => {
  if (r.output.kind !== 'logits') throw new Error('the last stage answers logits');
  return r.output.logits;
};

async function codeOf(p: Promise<unknown>): Promise<{ code: string; details?: Record<string, unknown> }> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(MeshError);
    return { code: (e as MeshError).code, details: (e as MeshError).details };
  }
  throw new Error('expected a failure');
}

describe('the llama.cpp stages in a worker thread', () => {
  it("keeps this thread responsive through a long prefill of a layer range, with the in-thread stage's rows and logits", async () => {
    const path = await syntheticModel({ layers: 4, embd: 1024, ffn: 2816, heads: 16, vocab: 512, type: 'q8_0', seed: 12 });
    const source = kept(await openTensorSource(path));
    const tokens = Int32Array.from({ length: 1024 }, (_, i) => (i * 37 + 5) % 512);
    const run = async (make: () => StageBackend) => {
      const [first, last] = [kept(make()), kept(make())];
      await first.load(source, { start: 0, end: 3 });
      await last.load(source, { start: 3, end: 4 });
      for (const b of [first, last]) await b.openSession('s', { contextLength: 2048 });
      const stalled = await longestStall(() => first.forwardRows!('s', { kind: 'tokens', tokens }, 0, 'f32'));
      const rows = rowsOf(stalled.value);
      const logits = logitsOf(await last.forwardRows!('s', rows, 0, 'f32'));
      return { ...stalled, first, last, rows, logits };
    };
    const inThread = await run(() => new LlamaCppRangeStage(OPTIONS));
    const worker = await run(() => stageBackendInThread('llamacpp-range', OPTIONS));
    console.info(`1024-token prefill of layers [0, 3): in this thread ${inThread.ms.toFixed(0)} ms, stalling it ${inThread.stallMs.toFixed(0)} ms; in a worker thread ${worker.ms.toFixed(0)} ms, longest stall here ${worker.stallMs.toFixed(0)} ms`);
    // the in-thread stage holds this thread for most of its compute: the measure can fail
    expect(inThread.stallMs).toBeGreaterThan(0.5 * inThread.ms);
    expect(worker.stallMs).toBeLessThan(0.3 * worker.ms);
    expect(worker.rows.bytes).toEqual(inThread.rows.bytes);
    expect(worker.logits).toEqual(inThread.logits);
    expect(worker.logits.length).toBe(512);
    // the stats kept here are the engine's, after each call
    expect(worker.first.sessionStats('s')).toEqual(inThread.first.sessionStats('s'));
    expect(worker.last.sessionStats('s')).toEqual(inThread.last.sessionStats('s'));

    // a decode step as frames carry it (f16 rows), rewound and replayed: the same bytes again
    const step = async (b: { first: StageBackend; last: StageBackend }) => {
      const rows = rowsOf(await b.first.forwardRows!('s', { kind: 'tokens', tokens: Int32Array.of(7) }, 1024, 'f16'));
      return logitsOf(await b.last.forwardRows!('s', rows, 1024, 'f16'));
    };
    const once = await step(worker);
    for (const b of [worker.first, worker.last]) await b.truncateSession('s', 1024);
    expect(worker.first.sessionStats('s').position).toBe(1024);
    expect(await step(worker)).toEqual(once);
    expect(await step(inThread)).toEqual(once);

    // error codes and their details cross the thread
    expect(await codeOf(worker.first.forward('s', { kind: 'tokens', tokens: Int32Array.of(1) }, 3))).toEqual({ code: 'POSITION_MISMATCH', details: { expected: 1025, got: 3 } });
    expect((await codeOf(worker.last.forward('s', { kind: 'tokens', tokens: Int32Array.of(1) }, 1025))).code).toBe('BAD_STAGE_INPUT');
    expect((await codeOf(worker.first.truncateSession('s', 1100))).code).toBe('POSITION_MISMATCH');
    expect((await codeOf(worker.first.releaseSession('nope'))).code).toBe('SESSION_UNKNOWN');
    expect((await codeOf(worker.first.openSession('s', { contextLength: 16 }))).code).toBe('SESSION_EXISTS');
  }, 300_000);

  it("carries forwardBatch through the thread: concurrent sessions' steps give the in-thread stage's batched rows and logits", async () => {
    const source = kept(await openTensorSource(await stories260K()));
    const prompts = [STORIES_PROMPT_TOKENS, [1, 90, 250], [1, 450, 93, 12, 7, 8]];
    const run = async (make: () => StageBackend) => {
      const [first, last] = [kept(make()), kept(make())];
      await first.load(source, { start: 0, end: 3 });
      await last.load(source, { start: 3, end: 5 });
      for (const [i, p] of prompts.entries()) {
        for (const b of [first, last]) await b.openSession(`s${i}`, { contextLength: 32 });
        await last.forwardRows!(`s${i}`, rowsOf(await first.forwardRows!(`s${i}`, { kind: 'tokens', tokens: Int32Array.from(p) }, 0, 'f16')), 0, 'f16');
      }
      const steps = (inputs: Array<BatchStep['input']>) => prompts.map((p, i): BatchStep => ({ sessionId: `s${i}`, input: inputs[i]!, position: p.length, outDtype: 'f16' }));
      const rows = (await first.forwardBatch!(steps(prompts.map((_, i) => ({ kind: 'tokens', tokens: Int32Array.of(10 + i) }))))).map((r) => rowsOf(r as RowsForwardResult));
      const logits = (await last.forwardBatch!(steps(rows))).map((r) => logitsOf(r as RowsForwardResult));
      return { rows: rows.map((r) => r.bytes), logits, stats: prompts.map((_, i) => [first.sessionStats(`s${i}`), last.sessionStats(`s${i}`)]) };
    };
    const inThread = await run(() => new LlamaCppRangeStage(OPTIONS));
    const worker = await run(() => stageBackendInThread('llamacpp-range', OPTIONS));
    expect(worker.rows).toEqual(inThread.rows);
    expect(worker.logits).toEqual(inThread.logits);
    expect(worker.stats).toEqual(inThread.stats);
    expect(worker.stats[2]![0]!.position).toBe(7);
  }, 120_000);

  it("fails a load with the source's own code when a read fails (a shard whose bytes fail verification)", async () => {
    const source = kept(await openTensorSource(await stories260K()));
    const refusing: TensorSource = { ...source, read: async () => Promise.reject(new MeshError('TENSOR_HASH_MISMATCH', "tensor 'blk.0.attn_q.weight': not the manifest's bytes")), close: async () => undefined };
    const backend = kept(stageBackendInThread('llamacpp-range', OPTIONS));
    expect((await codeOf(backend.load(refusing, { start: 0, end: 3 }))).code).toBe('TENSOR_HASH_MISMATCH');
    // the thread lives on, and loads the shard when its bytes are right
    await backend.load(source, { start: 0, end: 3 });
    expect(backend.info?.weightBytes).toBeGreaterThan(0);
  }, 120_000);

  it('fails every call with LLAMACPP_THREAD_FAILED once its thread has died, instead of hanging', async () => {
    const source = kept(await openTensorSource(await stories260K()));
    const { backend, worker } = stageThread('llamacpp-range', OPTIONS);
    kept(backend);
    await backend.load(source, { start: 0, end: 3 });
    await backend.openSession('s', { contextLength: 32 });
    await worker.terminate();
    const failed = await codeOf(backend.forward('s', { kind: 'tokens', tokens: Int32Array.from(STORIES_PROMPT_TOKENS) }, 0));
    expect(failed.code).toBe('LLAMACPP_THREAD_FAILED');
    expect((await codeOf(backend.openSession('t', { contextLength: 32 }))).code).toBe('LLAMACPP_THREAD_FAILED');
    await backend.dispose(); // a dead thread holds nothing: disposing it does not fail
  }, 120_000);

  it("runs the whole-model stage from the model's own file, with the in-thread stage's logits", async () => {
    const source = kept(await openTensorSource(await stories260K()));
    const run = async (b: StageBackend) => {
      kept(b);
      await b.load(source, { start: 0, end: 5 });
      await b.openSession('s', { contextLength: 64 });
      const r = await b.forward('s', { kind: 'tokens', tokens: Int32Array.from(STORIES_PROMPT_TOKENS) }, 0);
      return { logits: r.output.kind === 'logits' ? r.output.logits : new Float32Array(), stats: b.sessionStats('s') };
    };
    const inThread = await run(new LlamaCppStage(OPTIONS));
    const worker = await run(stageBackendInThread('llamacpp', OPTIONS));
    expect(worker.logits).toEqual(inThread.logits);
    expect(worker.logits.length).toBe(512);
    expect(worker.stats).toEqual(inThread.stats);
  }, 120_000);
});
