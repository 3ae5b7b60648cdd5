// How long the calling thread's timers stall while some work runs: the measure of whether a
// stage engine computes on this thread (a stall as long as the work) or in another.

/** The longest gap between 5 ms timer ticks of this thread while `work` runs, and its result. */
export async function longestStall<T>(work: () => Promise<T>): Promise<{ stallMs: number; ms: number; value: T }> {
  let last = performance.now();
  let stallMs = 0;
  const tick = setInterval(() => {
    const now = performance.now();
    stallMs = Math.max(stallMs, now - last);
    last = now;
  }, 5);
  const t0 = performance.now();
  try {
    const value = await work();
    const ms = performance.now() - t0;
    await new Promise((r) => setTimeout(r, 20)); // the tick that ends a stall records it
    return { stallMs, ms, value };
  } finally {
    clearInterval(tick);
  }
}
