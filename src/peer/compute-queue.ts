// One stage's compute, one job at a time, scheduled fairly across sessions: a decode step (one
// token, someone waiting for their next token) goes before any prefill chunk, and among prefill
// chunks the session served longest ago goes first (a new one before the long prompt that has
// been running). A long prompt arrives as many bounded chunks, so another session's next token
// waits for at most the chunk already running. A session that just opened is expected: for a
// moment other sessions' chunks wait for its first frame, which is on its way. Cancelling a
// session drops its queued jobs at once and waits only for the one in flight.

import { MeshError } from '../errors.ts';

export type JobKind = 'decode' | 'prefill';

/** Runs `f` after the I/O already pending (Node's setImmediate; a zero timeout in browsers). */
const yieldToIo: (f: () => void) => void = typeof setImmediate === 'function' ? (f) => void setImmediate(f) : (f) => void setTimeout(f, 0);

interface Job {
  session: string;
  run: () => Promise<unknown>;
  /** called with the job's result and the ms it waited for its turn */
  done: (value: unknown, waitedMs: number) => void;
  reject: (e: unknown) => void;
  queuedAt: number;
}

export class ComputeQueue {
  private readonly decodes: Job[] = [];
  /** prefill chunks per session, sessions in turn order */
  private readonly prefills = new Map<string, Job[]>();
  private running: Job | null = null;
  private scheduled = false;
  /** when each session's last job started (performance.now()) */
  private readonly lastServed = new Map<string, number>();
  /** sessions whose first frame is on its way, and until when other prefill chunks wait for it */
  private readonly expected = new Map<string, number>();
  /** expected sessions whose first frame came: their next prefill job goes before the others */
  private readonly favored = new Set<string>();
  private idle: Array<() => void> = [];

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

  /** Runs `job` for `session` when its turn comes; resolves with its result and how long it waited (ms). */
  run<T>(session: string, kind: JobKind, job: () => Promise<T>): Promise<{ value: T; waitedMs: number }> {
    if (this.expected.delete(session)) this.favored.add(session);
    return new Promise((resolve, reject) => {
      const entry: Job = { session, run: job, done: (value, waitedMs) => resolve({ value: value as T, waitedMs }), reject, queuedAt: performance.now() };
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
    while (this.running?.session === session) await new Promise<void>((r) => this.idle.push(r));
  }

  private next(): Job | undefined {
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

  private pump(): void {
    if (this.running) return;
    const job = this.next();
    if (!job) return;
    this.running = job;
    this.lastServed.set(job.session, performance.now());
    const waited = performance.now() - job.queuedAt;
    void job.run().then((v) => job.done(v, waited), job.reject).finally(() => {
      this.running = null;
      for (const wake of this.idle.splice(0)) wake();
      this.schedule();
    });
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
