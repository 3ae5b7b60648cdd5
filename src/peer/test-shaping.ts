// Test-only shaping of a native node, for benchmarks of slow and far peers on one machine (the
// kernel here has no netem): `node --test-slow-factor F` makes every forward pass take F times
// its own time (the stage sleeps the difference, like a slower device, not burning a core) —
// its own: the pass's wall time, but on the CPU engine no more than the CPU time this process
// spent in it, so time spent waiting for a core that another process on this machine holds is
// not multiplied by F (three slowed nodes on two shared cores are three devices, not one
// device's queue; a GPU's pass costs no CPU time, so other engines keep the wall time);
// `node --test-slow-after N` lets the node's first N forward passes (over every shard it loads,
// its calibration's among them: peer/calibrate.ts CALIBRATION_PASSES) run at their own speed
// and slows the ones after — a device that calibrated fast and then got slower (throttled,
// busy), which the server sees only in its live step timings (signaling-server/live-speed.ts);
// `node --test-link-delay-ms D` holds every frame and control message this node receives for D
// ms before handling it and every one it sends for D ms before sending — its links gain 2·D of
// round trip, as the server's heartbeat measures it. Nothing else turns these on.
//
// A timer fires late (the kernel's wake-up, Node's whole-millisecond timers: 0.2-0.5 ms a timer
// in the nodes of bench wan, 2·S timers on an S-stage token's path), and a link's latency does
// not: held messages wait on one delay line per D, in the order they came (as they did on
// timers of one delay), each line's timer set that much early — the process's running mean of
// how late its timers fired — and rounded to whole ms at random, so a message waits D on
// average (one may wait up to a millisecond less or more).

import type { StageBackend } from '../backends/types.ts';
import type { Frame } from '../protocol/frame.ts';
import type { FrameHandler, FrameLink } from '../transport/link.ts';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** CPU time this process has used, every thread of it (ms). */
function processCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/** The forward passes a node has run, over every backend it loaded (`--test-slow-after` counts them). */
export interface PassCount {
  passes: number;
}

/**
 * `backend` whose forward passes take `factor` times their own time (and say so in computeMs),
 * once `count` has seen `after` passes (a batched pass is one)
 */
export function slowedBackend(backend: StageBackend, factor: number, after = 0, count: PassCount = { passes: 0 }): StageBackend {
  if (!(factor > 1)) return backend;
  const onCores = backend.kind === 'cpu';
  /** runs `pass`, then sleeps until `factor` times its own time has passed; returns that time (null: not slowed yet) */
  const slowed = async <R>(pass: () => Promise<R>, computeMs: (r: R) => number): Promise<{ r: R; ms: number | null }> => {
    if (++count.passes <= after) return { r: await pass(), ms: null };
    const cpu0 = processCpuMs();
    const t0 = performance.now();
    const r = await pass();
    const own = onCores ? Math.min(computeMs(r), processCpuMs() - cpu0) : computeMs(r);
    const ms = Math.max(own * factor, performance.now() - t0);
    await sleep(ms - (performance.now() - t0));
    return { r, ms };
  };
  const slow = async <R extends { computeMs: number }>(pass: () => Promise<R>): Promise<R> => {
    const { r, ms } = await slowed(pass, (x) => x.computeMs);
    return ms === null ? r : { ...r, computeMs: ms };
  };
  const forwardRows = backend.forwardRows?.bind(backend);
  const forward = (...a: Parameters<StageBackend['forward']>): ReturnType<StageBackend['forward']> => slow(() => backend.forward(...a));
  const rows = forwardRows && ((...a: Parameters<NonNullable<StageBackend['forwardRows']>>): ReturnType<NonNullable<StageBackend['forwardRows']>> => slow(() => forwardRows(...a)));
  // a batched pass is slowed as a whole, as one pass of a slower device
  const forwardBatch = backend.forwardBatch?.bind(backend);
  const batch =
    forwardBatch &&
    (async (...a: Parameters<NonNullable<StageBackend['forwardBatch']>>): ReturnType<NonNullable<StageBackend['forwardBatch']>> => {
      const { r: rs, ms } = await slowed(() => forwardBatch(...a), (x) => x[0]?.computeMs ?? 0);
      return ms === null ? rs : rs.map((r) => ({ ...r, computeMs: ms }));
    });
  // everything else is the backend's own, called on it (its fields stay its own)
  return new Proxy(backend, {
    get(target, key) {
      if (key === 'forward') return forward;
      if (key === 'forwardRows') return rows;
      if (key === 'forwardBatch') return batch;
      const v = Reflect.get(target, key, target) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

/** How late this process's delay-line timers fired (ms): a running mean, bounded. */
let timerLateMs = 0;
const MAX_LATE_MS = 4;

/** Callbacks run `ms` after they were queued, in the order they were queued. */
class DelayLine {
  private readonly held: Array<{ due: number; run: () => void }> = [];
  private armed = false;

  constructor(private readonly ms: number) {}

  push(run: () => void): void {
    this.held.push({ due: performance.now() + this.ms, run });
    if (!this.armed) this.arm();
  }

  private arm(): void {
    const head = this.held[0];
    if (!head) return;
    this.armed = true;
    const aim = head.due - timerLateMs;
    setTimeout(() => {
      const now = performance.now();
      // (a timer the machine's load held up for long says little about the next: a step of at most 1 ms)
      timerLateMs = Math.min(MAX_LATE_MS, Math.max(0, timerLateMs + Math.max(-1, Math.min(1, now - aim - timerLateMs)) / 8));
      this.armed = false;
      // the head goes (its timer, rounded down, may fire a little early: on average it is on time), then everything due by now
      this.held.shift()!.run();
      while (this.held.length > 0 && this.held[0]!.due - timerLateMs <= now) this.held.shift()!.run();
      this.arm();
    }, Math.max(0, Math.floor(aim - performance.now() + Math.random()))); // (rounded at random: Node's timers count whole ms)
  }
}

/** The process's delay line for `ms` (one per delay: messages of one delay keep their order). */
const lines = new Map<number, DelayLine>();
function held(ms: number): Promise<void> {
  let line = lines.get(ms);
  if (!line) lines.set(ms, (line = new DelayLine(ms)));
  return new Promise((resolve) => line.push(resolve));
}

/** A handler that sees each request `ms` late and answers `ms` late. */
export function delayedHandler(handler: FrameHandler, ms: number): FrameHandler {
  if (!(ms > 0)) return handler;
  return async (f: Frame) => {
    await held(ms);
    const reply = await handler(f);
    await held(ms);
    return reply;
  };
}

/** A link whose requests leave `ms` late and whose replies are read `ms` late. */
export function delayedLink(link: FrameLink, ms: number): FrameLink {
  if (!(ms > 0)) return link;
  const wrapped: FrameLink = {
    get remote() {
      return link.remote;
    },
    // (one delay line keeps the order)
    get ordered() {
      return link.ordered;
    },
    async request(f: Frame) {
      await held(ms);
      const reply = await link.request(f);
      await held(ms);
      return reply;
    },
    close: () => link.close(),
  };
  link.onClose = (reason) => wrapped.onClose?.(reason);
  return wrapped;
}

/** `fn` run `ms` later, in order with everything else held `ms`. */
export function later<A extends unknown[]>(fn: (...a: A) => void, ms: number): (...a: A) => void {
  if (!(ms > 0)) return fn;
  return (...a: A) => void held(ms).then(() => fn(...a));
}
