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
//
// Between forward passes the workers sleep (`rest`) and a pass wakes them (`wake`): a worker
// spinning on past its stage's pass took a core from the next stage of a route on the same
// machine. Here the control word they read says so, and a real engine's passes, with rests and
// wakes and gaps of every length between them, lose no wake-up and compute what one thread does.
import { afterEach, describe, expect, it } from 'vitest';
import { ComputePool } from '../src/backends/cpu/compute-pool.ts';
import type { KernelCall, PoolWorker } from '../src/backends/cpu/compute-pool.ts';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { engineLoader } from './support/engines.ts';
import { mulberry32 } from './support/prng.ts';
import { syntheticModel } from './support/synthetic.ts';

// control word indices and the worker's claim step, as WORKER_SOURCE reads them
const CLAIM = 1;
const TOTAL = 3;
const REST = 6;
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
    const stores = 5; // the publication's stores into the control words (REST among them)
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

  it('tells idle workers to sleep between passes, and a pass (or a job) to spin again', () => {
    const { pool, ctl } = poolWithPuppetWorker(new Array<number>(4).fill(0));
    const words = ctl();
    expect(Atomics.load(words, REST)).toBe(0);
    pool.rest();
    expect(Atomics.load(words, REST)).toBe(1);
    pool.wake();
    expect(Atomics.load(words, REST)).toBe(0);
    pool.rest();
    pool.run(job(2)); // a job without a wake still finds its workers spinning between its calls
    expect(Atomics.load(words, REST)).toBe(0);
    pool.dispose();
  });
});

const load = engineLoader();

describe('the compute pool\'s workers between passes', () => {
  it('wake for every pass after any gap (no lost wake-up), and the passes compute what one thread does', async () => {
    const path = await syntheticModel({ layers: 2, embd: 256, ffn: 768, heads: 4, vocab: 512, type: 'f32', seed: 5 });
    const engine = async (threads: number) => {
      const b = await load(createNodeCpuBackend({ threads }), path, { start: 0, end: 2 });
      await b.openSession('s', { contextLength: 256 });
      return b;
    };
    const one = await engine(1);
    const three = await engine(3);
    const rand = mulberry32(3);
    const logitsOf = async (b: StageBackend, token: number, position: number) => {
      const r = await b.forward('s', { kind: 'tokens', tokens: Int32Array.of(token) }, position);
      return r.output.kind === 'logits' ? r.output.logits : new Float32Array();
    };
    for (let position = 0; position < 48; position++) {
      // no gap (workers still spinning, REST_SPIN_MS), a short busy one, a sleep (workers asleep)
      const gap = Math.floor(rand() * 3);
      if (gap === 1) for (const t = performance.now(); performance.now() - t < 0.05; );
      if (gap === 2) await new Promise((r) => setTimeout(r, 2));
      const token = (position * 29 + 7) % 512;
      const [a, b] = [await logitsOf(one, token, position), await logitsOf(three, token, position)];
      expect(b, `position ${position}`).toEqual(a);
    }
  }, 60_000);
});
