// One stage's compute, one job at a time, scheduled fairly across sessions: a decode step (one
// token, someone waiting for their next token) goes before any prefill chunk, and among prefill
// chunks the session served longest ago goes first (a new one before the long prompt that has
// been running). A long prompt arrives as many bounded chunks, so another session's next token
// waits for at most the chunk already running. A session that just opened is expected: for a
// moment other sessions' chunks wait for its first frame, which is on its way. Cancelling a
// session drops its queued jobs at once and waits only for the one in flight.
//
// Batching: a decode job may carry a step the stage's backend can run together with other
// sessions' (`Batcher`). When such a job's turn comes, the decode jobs of other sessions that
// are waiting with it (up to `max`) join it and the batcher runs them as one pass — the frames
// that reached the stage while the last job ran, so a batch needs no wait of its own. Each job
// still gets its own result and its own wait; a batch that fails changed nothing (the
// batcher's contract), and its jobs then run one by one, each meeting its own error.

import { MeshError } from '../errors.ts';

export type JobKind = 'decode' | 'prefill';

/** Runs several sessions' steps as one pass: one result per step, in order; a rejection means no step ran. */
export interface Batcher<S> {
  run(steps: S[]): Promise<unknown[]>;
  /** most steps in one batch */
  max: number;
}

/** How much batching happened, for the stage's status. */
export interface BatchCounters {
  /** batches of two or more steps that ran */
  batches: number;
  /** steps that ran in them */
  steps: number;
  /** the most steps one batch held */
  largest: number;
  /** batches that failed and ran their steps one by one */
  fallbacks: number;
  /** ms the batches took, summed */
  batchMs: number;
  /** decode steps that could have joined a batch but ran alone (nobody else's was waiting) */
  alone: number;
  /** ms those took, summed */
  aloneMs: number;
}

/** How long a just-opened session's first frame is waited for before long prompts go on (ms): a round trip through the server. */
export const NEW_SESSION_HOLD_MS = 50;
/** The bound on a hold while a session is opened or rewound (the hold ends when that does). */
const HOLD_WHILE_PREPARING_MS = 10_000;

/** Runs `f` after the I/O already pending (Node's setImmediate; a zero timeout in browsers). */
const yieldToIo: (f: () => void) => void = typeof setImmediate === 'function' ? (f) => void setImmediate(f) : (f) => void setTimeout(f, 0);

interface Job<S> {
  session: string;
  run: () => Promise<unknown>;
  /** what a batcher takes for this job, when it may join a batch */
  step: S | undefined;
  /** called with the job's result and the ms it waited for its turn */
  done: (value: unknown, waitedMs: number) => void;
  reject: (e: unknown) => void;
  queuedAt: number;
}

export class ComputeQueue<S = never> {
  private readonly decodes: Job<S>[] = [];
  /** prefill chunks per session, sessions in turn order */
  private readonly prefills = new Map<string, Job<S>[]>();
  /** the job (or batch of jobs) computing now */
  private running: Job<S>[] | null = null;
  readonly batching: BatchCounters = { batches: 0, steps: 0, largest: 0, fallbacks: 0, batchMs: 0, alone: 0, aloneMs: 0 };
  private scheduled = false;
  /** when each session's last job started (performance.now()) */
  private readonly lastServed = new Map<string, number>();
  /** sessions whose first frame is on its way, and until when other prefill chunks wait for it */
  private readonly expected = new Map<string, number>();
  /** expected sessions whose first frame came: their next prefill job goes before the others */
  private readonly favored = new Set<string>();
  private idle: Array<() => void> = [];

  constructor(private readonly batcher: Batcher<S> | null = null) {}

  /** Jobs waiting (not the one running). */
  get waiting(): number {
    let n = this.decodes.length;
    for (const q of this.prefills.values()) n += q.length;
    return n;
  }

  /** A session just opened: for up to `ms`, prefill chunks of other sessions wait for its first job. */
  expect(session: string, ms: number): void {
    this.expected.set(session, performance.now() + ms);
    const t = setTimeout(() => this.schedule(), ms + 1);
    (t as { unref?: () => void }).unref?.();
  }

  /**
   * Opens or rewinds a session (`prepare`) with other sessions' prefill chunks held until it is
   * done, then for NEW_SESSION_HOLD_MS more (its first frame follows at once and gets the next
   * turn). An engine in a worker thread opens or rewinds after the chunk it is computing; a hold
   * that lapsed meanwhile let the next chunk start first, and the new turn waited two chunks,
   * not one (test/hardening/fairness.test.ts, 1 run in 5). A failed `prepare` holds nothing.
   */
  async holdWhile(session: string, prepare: () => Promise<void>): Promise<void> {
    this.expect(session, HOLD_WHILE_PREPARING_MS);
    try {
      await prepare();
    } catch (e) {
      this.expect(session, 0);
      throw e;
    }
    this.expect(session, NEW_SESSION_HOLD_MS);
  }

  /**
   * Runs `job` for `session` when its turn comes; resolves with its result and how long it waited
   * (ms). A decode job with a `step` may run in a batch instead: its result is then the batcher's
   * answer for the step, which must be what `job` would have given.
   */
  run<T>(session: string, kind: JobKind, job: () => Promise<T>, step?: S): Promise<{ value: T; waitedMs: number }> {
    if (this.expected.delete(session)) this.favored.add(session);
    return new Promise((resolve, reject) => {
      const entry: Job<S> = { session, run: job, step: kind === 'decode' ? step : undefined, done: (value, waitedMs) => resolve({ value: value as T, waitedMs }), reject, queuedAt: performance.now() };
      if (kind === 'decode') this.decodes.push(entry);
      else {
        let q = this.prefills.get(session);
        if (!q) this.prefills.set(session, (q = []));
        q.push(entry);
      }
      this.schedule();
    });
  }

  /** Drops `session`'s queued jobs (rejected with `reason`); resolves once none of its jobs runs. */
  async cancel(session: string, reason: MeshError): Promise<void> {
    for (let i = this.decodes.length - 1; i >= 0; i--) {
      if (this.decodes[i]!.session === session) this.decodes.splice(i, 1)[0]!.reject(reason);
    }
    for (const j of this.prefills.get(session) ?? []) j.reject(reason);
    this.prefills.delete(session);
    this.expected.delete(session);
    this.favored.delete(session);
    this.lastServed.delete(session);
    while (this.running?.some((j) => j.session === session)) await new Promise<void>((r) => this.idle.push(r));
  }

  private next(): Job<S> | undefined {
    const d = this.decodes.shift();
    if (d) return d;
    const now = performance.now();
    for (const [s, until] of this.expected) if (until <= now) this.expected.delete(s);
    if (this.expected.size > 0) return undefined; // a new session's first frame is due: hold the long prompts a moment
    // a session that was waited for, else the one served longest ago (never, for a new one)
    let pick: string | null = [...this.favored].find((s) => this.prefills.has(s)) ?? null;
    if (pick !== null) this.favored.delete(pick);
    else for (const s of this.prefills.keys()) if (pick === null || (this.lastServed.get(s) ?? -Infinity) < (this.lastServed.get(pick) ?? -Infinity)) pick = s;
    if (pick === null) return undefined;
    const q = this.prefills.get(pick)!;
    const j = q.shift()!;
    if (q.length === 0) this.prefills.delete(pick);
    return j;
  }

  /** `first` and the waiting decode steps of other sessions that may join it, up to the batcher's max */
  private group(first: Job<S>): Job<S>[] {
    const group = [first];
    if (!this.batcher || first.step === undefined) return group;
    const sessions = new Set([first.session]);
    for (let i = 0; i < this.decodes.length && group.length < this.batcher.max; ) {
      const j = this.decodes[i]!;
      if (j.step === undefined || sessions.has(j.session)) i++;
      else {
        group.push(...this.decodes.splice(i, 1));
        sessions.add(j.session);
      }
    }
    return group;
  }

  private pump(): void {
    if (this.running) return;
    const job = this.next();
    if (!job) return;
    const group = this.group(job);
    this.running = group;
    const started = performance.now();
    for (const j of group) this.lastServed.set(j.session, started);
    void this.runGroup(group, started).finally(() => {
      this.running = null;
      for (const wake of this.idle.splice(0)) wake();
      this.schedule();
    });
  }

  private async runGroup(group: Job<S>[], started: number): Promise<void> {
    if (group.length > 1) {
      const values = await this.batcher!.run(group.map((j) => j.step!)).catch(() => null);
      if (values) {
        this.batching.batches++;
        this.batching.steps += group.length;
        this.batching.largest = Math.max(this.batching.largest, group.length);
        this.batching.batchMs += performance.now() - started;
        group.forEach((j, i) => j.done(values[i], started - j.queuedAt));
        return;
      }
      this.batching.fallbacks++;
    }
    // alone (or a failed batch's steps, one by one): each job meets its own result or error
    for (const j of group) await j.run().then((v) => j.done(v, started - j.queuedAt), j.reject);
    if (group.length === 1 && group[0]!.step !== undefined && this.batcher) {
      this.batching.alone++;
      this.batching.aloneMs += performance.now() - started;
    }
  }

  /**
   * Starts the next job after the I/O already pending: a frame that arrived during the last job
   * (another session's decode step) is read and queued first — a session's next chunk, queued in
   * a microtask, would otherwise start before the event loop ever polled its sockets.
   */
  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    yieldToIo(() => {
      this.scheduled = false;
      this.pump();
    });
  }
}
