// The CPU engine's compute pool hands a job's kernel calls out through shared control words
// (compute-pool.ts): the calling thread publishes a job (its calls, then the claim word, the done
// count, the call count, the generation) and every thread claims calls with a compare-exchange on
// the claim word. A worker may still be in the previous job's claim loop, between reading the
// claim word and exchanging it, at any moment of the next job's publication. It once could claim
// "call n" of the old job out of the new job's list, because the call count rose before the claim
// word changed: that call ran twice and was counted into the new job, so the job could return
// before its last call finished — under load, a rare wrong token (a seeded completion whose
// streamed and whole replies differed). Here a stale worker's claim step is played at every pair
// of points of a publication, by wrapping Atomics.store; no such claim may succeed, and each call
// of the job runs exactly once.
import { afterEach, describe, expect, it } from 'vitest';
import { ComputePool } from '../src/backends/cpu/compute-pool.ts';
import type { KernelCall, PoolWorker } from '../src/backends/cpu/compute-pool.ts';

// control word indices and the worker's claim step, as WORKER_SOURCE reads them
const CLAIM = 1;
const TOTAL = 3;
const tagOf = (generation: number): number => (generation & 0x7fff) << 16;

const realStore = Atomics.store;
afterEach(() => {
  Atomics.store = realStore;
});

/** A pool with one worker that never runs: the test plays its steps on the control words it was sent. */
function poolWithPuppetWorker(ran: number[]) {
  let ctl: Int32Array | null = null;
  const worker: PoolWorker = {
    postMessage: (m) => void (ctl = new Int32Array((m as { ctl: SharedArrayBuffer }).ctl)),
    terminate: () => undefined,
    onError: () => undefined,
  };
  const memory = new WebAssembly.Memory({ initial: 1, maximum: 1, shared: true });
  const pool = new ComputePool({ memory, modules: [], names: [], fns: [(i: number) => void ran[i]!++] }, 1, () => worker);
  return { pool, ctl: () => ctl! };
}

const job = (n: number): KernelCall[] => Array.from({ length: n }, (_, i) => ({ fn: 0, args: [i] }) as unknown as KernelCall);

describe('the compute pool', () => {
  it('a worker left in the last job\'s claim loop never claims a call of the next job, wherever its steps fall in the publication', () => {
    const stores = 4; // the publication's stores into the control words
    let tried = 0;
    for (let read = 0; read <= stores; read++) {
      for (let exchange = read; exchange <= stores; exchange++) {
        const ran = new Array<number>(8).fill(0);
        const { pool, ctl } = poolWithPuppetWorker(ran);
        pool.run(job(2)); // generation 1, run by this thread alone: the worker holds its tag
        ran.fill(0);
        const words = ctl();
        const staleTag = tagOf(1);
        let point = 0;
        let word = -1;
        const step = (): void => {
          // the stale worker's claim step, split where a thread can be descheduled
          if (point === read) word = Atomics.load(words, CLAIM);
          if (point === exchange && word >= 0) {
            tried++;
            const fresh = (word & 0x7fff0000) === staleTag && (word & 0xffff) < Atomics.load(words, TOTAL);
            if (fresh && Atomics.compareExchange(words, CLAIM, word, word + 1) === word) {
              throw new Error(`a stale worker claimed call ${word & 0xffff} (read after store ${read}, exchanged after store ${exchange})`);
            }
          }
          point++;
        };
        Atomics.store = ((a: Int32Array, i: number, v: number) => {
          const r = realStore(a, i, v);
          if (a.buffer === words.buffer) step();
          return r;
        }) as typeof Atomics.store;
        step(); // point 0: before the first store
        pool.run(job(6)); // generation 2: more calls than the last, so a stale "call 2" would be in range
        Atomics.store = realStore;
        expect(ran.slice(0, 6)).toEqual([1, 1, 1, 1, 1, 1]);
        pool.dispose();
      }
    }
    expect(tried).toBe(((stores + 1) * (stores + 2)) / 2);
  });
});
