// `node --pin-threads` (backends/cpu/node-threads.ts pinnedNodeWorkers): the CPU engine's caller
// thread and each kernel worker get one CPU of their own, so a VM cannot wake an idle worker on
// its caller's core. Here a pinned engine runs in a worker thread, as a node runs it: each of its
// threads is allowed exactly one CPU, no two the same, this thread keeps the CPUs it had, and
// the logits are the unpinned engine's.
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { allowedCpus, createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { cpuBackendInThread } from '../workers/stage-thread.ts';
import { engineLoader } from './support/engines.ts';
import { syntheticModel } from './support/synthetic.ts';

const load = engineLoader();

/** each thread of this process and the CPUs it may run on, as Linux lists them */
function threadCpus(): Map<string, string> {
  const out = new Map<string, string>();
  for (const t of readdirSync('/proc/self/task')) {
    try {
      const m = /Cpus_allowed_list:\s*(\S+)/.exec(readFileSync(`/proc/self/task/${t}/status`, 'utf8'));
      if (m) out.set(t, m[1]!);
    } catch {
      // the thread ended while we read
    }
  }
  return out;
}

describe('pinned CPU engine threads', () => {
  it('gives the engine thread and each worker a CPU of its own, leaves this thread alone, and computes the same logits', async () => {
    const cpus = allowedCpus();
    expect(cpus, 'sched_getaffinity through koffi on Linux').not.toBeNull();
    expect(cpus!.length, 'this test needs two CPUs (CI has two)').toBeGreaterThanOrEqual(2);
    const path = await syntheticModel({ layers: 2, embd: 256, ffn: 768, heads: 4, vocab: 512, type: 'f32', seed: 9 });
    const logitsOf = async (b: StageBackend): Promise<Float32Array> => {
      await load(b, path, { start: 0, end: 2 });
      await b.openSession('s', { contextLength: 64 });
      const r = await b.forward('s', { kind: 'tokens', tokens: Int32Array.from([5, 77, 301, 12]) }, 0);
      return r.output.kind === 'logits' ? r.output.logits : new Float32Array();
    };
    const mine = readFileSync('/proc/thread-self/status', 'utf8').match(/Cpus_allowed_list:\s*(\S+)/)![1];
    const before = threadCpus();
    const pinned = await logitsOf(cpuBackendInThread({ threads: 2, pinThreads: true }));
    // the engine thread and its one worker, each alone on a CPU (a worker starts on its creator's
    // CPU and pins itself as its script begins: give it that moment); the engine thread's loader
    // thread, started before it pinned, keeps every CPU
    let fresh: Array<[string, string]> = [];
    let single: number[] = [];
    for (const t0 = Date.now(); Date.now() - t0 < 10_000; await new Promise((r) => setTimeout(r, 20))) {
      fresh = [...threadCpus()].filter(([t]) => !before.has(t));
      single = fresh.filter(([, list]) => /^\d+$/.test(list)).map(([, list]) => Number(list));
      if (single.length === 2 && new Set(single).size === 2) break;
    }
    expect(single.length, `new threads and their CPUs: ${JSON.stringify(fresh)}`).toBe(2);
    expect(new Set(single).size, `new threads and their CPUs: ${JSON.stringify(fresh)}`).toBe(2);
    for (const c of single) expect(cpus).toContain(c);
    expect(readFileSync('/proc/thread-self/status', 'utf8').match(/Cpus_allowed_list:\s*(\S+)/)![1]).toBe(mine);
    const plain = await logitsOf(createNodeCpuBackend({ threads: 2 }));
    expect(pinned.length).toBe(512);
    expect(pinned).toEqual(plain);
  }, 60_000);
});
