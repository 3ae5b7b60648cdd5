// A native node's CPU engine runs in a worker thread (workers/stage-thread.ts) so that the
// node's own thread stays free while a shard loads or a long prefill computes: there it answers
// the server's heartbeat (a node that misses it for 3.5 s is declared lost) and reads frames. Here
// a prefill long enough to take a while runs in the thread while this thread's timers are
// watched; the same call on the engine in this thread stalls them for as long as it computes
// (so the check can fail), and both give the same logits.
import { describe, expect, it } from 'vitest';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { cpuBackendInThread } from '../workers/stage-thread.ts';
import { engineLoader } from './support/engines.ts';
import { longestStall } from './support/stall.ts';
import { syntheticModel } from './support/synthetic.ts';

const load = engineLoader();

describe('the CPU engine in a worker thread', () => {
  it('keeps this thread responsive through a long prefill, with the in-thread engine\'s logits', async () => {
    const path = await syntheticModel({ layers: 4, embd: 512, ffn: 1536, heads: 8, vocab: 512, type: 'q8_0', seed: 11 });
    const tokens = Int32Array.from({ length: 768 }, (_, i) => (i * 37 + 5) % 512);
    const run = async (b: StageBackend) => {
      await load(b, path, { start: 0, end: 4 });
      await b.openSession('s', { contextLength: 1024 });
      return longestStall(() => b.forward('s', { kind: 'tokens', tokens }, 0));
    };
    const inThread = await run(createNodeCpuBackend({ threads: 1 }));
    const worker = await run(cpuBackendInThread({ threads: 1 }));
    console.info(`768-token prefill: in this thread ${inThread.ms.toFixed(0)} ms, stalling it ${inThread.stallMs.toFixed(0)} ms; in a worker thread ${worker.ms.toFixed(0)} ms, longest stall here ${worker.stallMs.toFixed(0)} ms`);
    // the in-thread engine holds this thread for most of its compute: the measure can fail
    expect(inThread.stallMs).toBeGreaterThan(0.5 * inThread.ms);
    expect(worker.stallMs).toBeLessThan(0.3 * worker.ms);
    const logits = (r: typeof worker) => (r.value.output.kind === 'logits' ? r.value.output.logits : new Float32Array());
    expect(logits(worker)).toEqual(logits(inThread));
    expect(logits(worker).length).toBe(512);
  }, 120_000);
});
