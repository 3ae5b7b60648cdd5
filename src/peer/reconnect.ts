// When a peer's control connection drops (the server restarted, the network blinked), it joins
// again: exponential back-off with jitter, so a restarted server is not met by every node at the
// same instant, for a bounded time, never after a refusal that trying again cannot fix.
// Browser-safe: native and browser peers share it.

export interface ReconnectOptions {
  /** keep trying for this long after the drop (ms, default 10 min) */
  forMs?: number;
  /** first wait (ms, default 500), doubled per attempt up to `maxMs` (default 15 s) */
  baseMs?: number;
  maxMs?: number;
}

export const RECONNECT_DEFAULTS = { forMs: 10 * 60_000, baseMs: 500, maxMs: 15_000 };

/** How long the n-th attempt waits: exponential from `baseMs`, capped at `maxMs`, with jitter (half to all of it). */
export function reconnectDelay(attempt: number, baseMs = RECONNECT_DEFAULTS.baseMs, maxMs = RECONNECT_DEFAULTS.maxMs, random = Math.random): number {
  const full = Math.min(maxMs, baseMs * 2 ** attempt);
  return full / 2 + random() * (full / 2);
}

/** Errors after which trying again cannot help: the secret is wrong, the link is not a room link. */
export const FATAL_JOIN_ERRORS: ReadonlySet<string> = new Set(['AUTH_FAILED', 'BAD_JOIN_URL']);

/**
 * Tries `join` until it succeeds (its result), a fatal error (thrown), the deadline (the last
 * error thrown), or `stopped()` (null).
 */
export async function rejoin<T>(join: () => Promise<T>, opts: ReconnectOptions, stopped: () => boolean, log: (line: string) => void): Promise<T | null> {
  const o = { ...RECONNECT_DEFAULTS, ...opts };
  const deadline = Date.now() + o.forMs;
  for (let attempt = 0; ; attempt++) {
    await new Promise((r) => setTimeout(r, reconnectDelay(attempt, o.baseMs, o.maxMs)));
    if (stopped()) return null;
    try {
      return await join();
    } catch (e) {
      if (FATAL_JOIN_ERRORS.has((e as { code?: string }).code ?? '') || Date.now() > deadline) throw e;
      log(`rejoin attempt ${attempt + 1} failed: ${(e as Error).message}`);
    }
  }
}
