// Worker threads for the CPU engine: each worker instantiates the same kernel modules over the
// arena's shared WebAssembly.Memory, and a job is a list of kernel calls (row ranges of a
// matmul, heads of attention) that the calling thread and the workers claim one at a time from
// a shared counter. A thread that is descheduled (a busy machine) claims nothing and the others
// finish its share, so a job never waits on a thread that has not started; the caller only
// waits for calls already claimed. Between the jobs of one forward pass idle workers spin, so
// the next matmul finds them awake (a sleeping worker takes tens of µs to wake, and a decode
// step is dozens of jobs); when the pass ends the caller says so (`rest`) and they sleep in
// Atomics.wait at once. Spinning on past the pass would take a core from whatever runs next:
// on a route of several stages on one machine, the next stage's own threads.
//
// Workers are plain scripts built from WORKER_SOURCE (no modules, no imports), started by a
// factory the host provides: node:worker_threads in Node (./node-threads.ts), Blob URLs in a
// cross-origin-isolated page.

import { MeshError } from '../../errors.ts';

/** What the pool needs of a worker, in Node or in a browser. */
export interface PoolWorker {
  postMessage(message: unknown): void;
  terminate(): unknown;
  /** called once with an error message if the worker fails */
  onError(handler: (message: string) => void): void;
}

export type WorkerFactory = (source: string) => PoolWorker;

/** kernel ids a call names (the order of `fns` in WORKER_SOURCE and in ComputePool.run) */
export const KERNEL_IDS = { mm_f32: 0, mm_q8: 1, attn: 2, swiglu: 3 } as const;
export type KernelId = (typeof KERNEL_IDS)[keyof typeof KERNEL_IDS];

/** one kernel call: its id and up to 14 i32 arguments */
export interface KernelCall {
  fn: KernelId;
  args: number[];
}

/**
 * Calls of `fn` over rows [0, rows) cut into `pieces` ranges, each a multiple of 4 rows apart
 * from the start (the kernels take rows in fours); `args(r0, r1)` gives a range's arguments.
 */
export function rowCalls(fn: KernelId, rows: number, pieces: number, args: (r0: number, r1: number, call: number) => number[]): KernelCall[] {
  const step = rowStep(rows, pieces);
  const calls: KernelCall[] = [];
  for (let r0 = 0; r0 < rows; r0 += step) calls.push({ fn, args: args(r0, Math.min(rows, r0 + step), calls.length) });
  return calls;
}

/** rows per call of rowCalls (the last may have fewer) */
function rowStep(rows: number, pieces: number): number {
  return Math.max(4, Math.ceil(rows / pieces / 4) * 4);
}

/** how many calls rowCalls makes */
export function rowCallCount(rows: number, pieces: number): number {
  return Math.ceil(rows / rowStep(rows, pieces));
}

/** multiply-adds below which a piece of a job costs more to hand out than to run (~10 µs) */
const MIN_PIECE_MACS = 1 << 18;

/**
 * Pieces to cut a job of `macs` multiply-adds into for `threads` threads: many each (up to 16),
 * so the share left when one thread finishes first, or starts late, is small — but none so
 * small that handing it out costs more than it saves.
 */
export function piecesFor(threads: number, macs = Infinity): number {
  if (threads === 1) return 1;
  return Math.max(threads, Math.min(16 * threads, Math.floor(macs / MIN_PIECE_MACS)));
}

const ARGS = 14;
const CALL_INTS = 1 + ARGS;
/** most calls one job holds */
export const MAX_CALLS = 1024;

// control words (Int32Array over a SharedArrayBuffer)
const GEN = 0; // job generation; workers sleep on it
const CLAIM = 1; // (generation & 0x7fff) << 16 | next call index
const DONE = 2; // calls finished in this generation
const TOTAL = 3; // calls in this generation
const QUIT = 4;
const FAILED = 5; // a worker's call threw (it still counts as done, so nobody waits forever)
const REST = 6; // 1 between forward passes: idle workers sleep rather than spin
const CTL_INTS = 8;

// Spinning is bounded in time, not in turns (a turn is 2–20 ns, as warm as the JIT has it).
/** ms an idle worker spins within a pass: longer than the gaps between its jobs (µs) */
const SPIN_MS = 0.5;
/** ms an idle worker spins between passes: the gap of a single process's sampling */
const REST_SPIN_MS = 0.02;
/**
 * ms the caller spins for calls a worker claimed before it sleeps until they are done. Bounded
 * because that worker may share the caller's core (after both slept, Linux on a VM often wakes
 * a thread on its waker's CPU), and then it runs only once the caller stops spinning; not
 * shorter, because sleeping after every job of a warm pass cost more than it saved (measured).
 */
const WAIT_SPIN_MS = 0.5;

// The worker: instantiate, then claim calls until told to quit. Kept in plain JS, standalone.
const WORKER_SOURCE = `
const port = typeof require === 'function' ? require('node:worker_threads').parentPort : self;
const onMessage = (f) => (port.on ? port.on('message', f) : (port.onmessage = (e) => f(e.data)));
onMessage((m) => {
  const env = { env: { mem: m.memory } };
  const instances = m.modules.map((mod) => new WebAssembly.Instance(mod, env));
  const fns = m.names.map(([i, name]) => instances[i].exports[name]);
  const ctl = new Int32Array(m.ctl);
  const jobs = new Int32Array(m.jobs);
  let seen = Atomics.load(ctl, ${GEN});
  for (;;) {
    let since = performance.now();
    for (let spins = 0; Atomics.load(ctl, ${GEN}) === seen && Atomics.load(ctl, ${QUIT}) === 0; ) {
      if ((++spins & 63) !== 0) continue;
      if (performance.now() - since < (Atomics.load(ctl, ${REST}) === 0 ? ${SPIN_MS} : ${REST_SPIN_MS})) continue;
      Atomics.wait(ctl, ${GEN}, seen);
      since = performance.now();
    }
    if (Atomics.load(ctl, ${QUIT}) !== 0) return;
    seen = Atomics.load(ctl, ${GEN});
    const tag = (seen & 0x7fff) << 16;
    for (;;) {
      const c = Atomics.load(ctl, ${CLAIM});
      if ((c & 0x7fff0000) !== tag || (c & 0xffff) >= Atomics.load(ctl, ${TOTAL})) break;
      if (Atomics.compareExchange(ctl, ${CLAIM}, c, c + 1) !== c) continue;
      const o = (c & 0xffff) * ${CALL_INTS};
      const a = jobs.subarray(o + 1, o + ${CALL_INTS});
      try {
        fns[jobs[o]](a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13]);
      } catch {
        Atomics.store(ctl, ${FAILED}, 1);
      }
      if (Atomics.add(ctl, ${DONE}, 1) + 1 === Atomics.load(ctl, ${TOTAL})) Atomics.notify(ctl, ${DONE});
    }
  }
});
`;

export interface PoolKernels {
  memory: WebAssembly.Memory;
  /** the kernel modules (compiled for a shared memory) */
  modules: WebAssembly.Module[];
  /** per kernel id (KERNEL_IDS order): its module's index in `modules` and its export name */
  names: [number, string][];
  /** the same kernels instantiated in this thread, in KERNEL_IDS order */
  fns: ((...args: number[]) => void)[];
}

export class ComputePool {
  private readonly ctl: Int32Array;
  private readonly jobs: Int32Array;
  private readonly workers: PoolWorker[] = [];
  private failure: string | null = null;
  private generation = 0;

  /** `workers` threads beside the caller's, over `kernels.memory` (which must be shared) */
  constructor(private readonly kernels: PoolKernels, workers: number, factory: WorkerFactory) {
    this.ctl = new Int32Array(new SharedArrayBuffer(CTL_INTS * 4));
    this.jobs = new Int32Array(new SharedArrayBuffer(MAX_CALLS * CALL_INTS * 4));
    for (let i = 0; i < workers; i++) {
      const w = factory(WORKER_SOURCE);
      w.onError((message) => (this.failure ??= message));
      w.postMessage({ memory: kernels.memory, modules: kernels.modules, names: kernels.names, ctl: this.ctl.buffer, jobs: this.jobs.buffer });
      this.workers.push(w);
    }
  }

  /** threads that run a job: the workers and the caller */
  get threads(): number {
    return this.workers.length + 1;
  }

  /**
   * A forward pass begins: sleeping workers wake now, while the caller prepares its first job,
   * and spin between the pass's jobs.
   */
  wake(): void {
    Atomics.store(this.ctl, REST, 0);
    Atomics.notify(this.ctl, GEN);
  }

  /** The pass has ended: idle workers sleep (after 20 µs) until the next `wake` or `run`. */
  rest(): void {
    Atomics.store(this.ctl, REST, 1);
  }

  /** Runs every call, on this thread and the workers; returns when all are done. */
  run(calls: readonly KernelCall[]): void {
    if (this.failure) throw new MeshError('CPU_WORKER_FAILED', `a CPU engine worker failed: ${this.failure}`);
    if (calls.length > MAX_CALLS) throw new MeshError('BAD_REQUEST', `a job of ${calls.length} kernel calls exceeds ${MAX_CALLS}`);
    const { ctl, jobs } = this;
    calls.forEach((c, i) => {
      jobs[i * CALL_INTS] = c.fn;
      for (let a = 0; a < c.args.length; a++) jobs[i * CALL_INTS + 1 + a] = c.args[a]!;
    });
    const gen = (this.generation = (this.generation + 1) | 0);
    const tag = (gen & 0x7fff) << 16;
    // The claim word first: a worker still in the last job's loop holds that job's claim word and
    // checks it against TOTAL before its compare-exchange. Were TOTAL raised first, a worker that
    // read the old word and then the new TOTAL could claim "call n of the old job" out of this
    // job's list (run twice, and counted into this job's DONE, so this call could return while a
    // call still ran): a busy machine's rare wrong token. With the word replaced first, its
    // exchange fails, and TOTAL still reads the old count until the word has moved on.
    Atomics.store(ctl, CLAIM, tag);
    Atomics.store(ctl, DONE, 0);
    Atomics.store(ctl, TOTAL, calls.length);
    Atomics.store(ctl, REST, 0);
    Atomics.store(ctl, GEN, gen);
    Atomics.notify(ctl, GEN);
    const fns = this.kernels.fns;
    for (;;) {
      const c = Atomics.load(ctl, CLAIM);
      if ((c & 0xffff) >= calls.length) break;
      if (Atomics.compareExchange(ctl, CLAIM, c, c + 1) !== c) continue;
      const call = calls[c & 0xffff]!;
      try {
        fns[call.fn]!(...call.args);
      } catch {
        Atomics.store(ctl, FAILED, 1);
      }
      Atomics.add(ctl, DONE, 1);
    }
    // wait only for calls a worker has claimed and not finished
    const since = performance.now();
    let spins = 0;
    for (let done = Atomics.load(ctl, DONE); done < calls.length; done = Atomics.load(ctl, DONE)) {
      if ((++spins & 63) === 0 && performance.now() - since > WAIT_SPIN_MS) Atomics.wait(ctl, DONE, done, 1);
    }
    if (Atomics.load(ctl, FAILED) !== 0) {
      this.failure = 'a kernel call trapped (a pointer outside the memory)';
      throw new MeshError('CPU_WORKER_FAILED', `a CPU engine worker failed: ${this.failure}`);
    }
  }

  dispose(): void {
    Atomics.store(this.ctl, QUIT, 1);
    Atomics.notify(this.ctl, GEN);
    for (const w of this.workers) w.terminate();
    this.workers.length = 0;
  }
}
