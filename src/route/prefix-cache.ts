// Sessions kept open after a generation so that the next request whose prompt extends one of
// them (chat turn k+1 = turn k's prompt + the reply + the new message) continues its KV cache
// instead of prefilling the whole conversation again. Per route, matched on token ids (longest
// common prefix), bounded by the positions all kept sessions hold (their KV memory) and a
// count, least recently used out first. A request takes its match out of the cache (a session
// serves one request at a time) and puts the session back when done.

import type { KeptSession } from './route-generation.ts';

export interface PrefixCacheOptions {
  /** most sessions kept (all routes) */
  maxSessions?: number;
  /** most KV positions kept over all sessions: the memory bound (each position costs n_layer × 2 × kv_dim on its stages) */
  maxPositions?: number;
  /** a match shorter than this is not worth a session (a fresh one is opened) */
  minPrefix?: number;
  /** called with each session evicted (close it on the route) */
  evict: (routeId: number, sessionId: string) => void;
}

interface Entry extends KeptSession {
  routeId: number;
  usedAt: number;
}

export interface PrefixMatch extends KeptSession {
  /** prompt tokens the session's KV already holds */
  position: number;
}

export class PrefixCache {
  private entries: Entry[] = [];
  private clock = 0;
  hits = 0;
  misses = 0;

  constructor(private readonly opts: PrefixCacheOptions) {}

  /** The kept session of `routeId` sharing the longest prefix with `prompt` that can hold `need` positions, taken out of the cache; null when none. */
  take(routeId: number, prompt: readonly number[], need: number): PrefixMatch | null {
    let best: Entry | null = null;
    let bestLen = 0;
    for (const e of this.entries) {
      if (e.routeId !== routeId || e.contextLength < need) continue;
      const n = commonPrefix(e.tokens, prompt);
      if (n > bestLen) [best, bestLen] = [e, n];
    }
    // one prompt token at least is prefilled again: its logits give the first new token
    const position = Math.min(bestLen, prompt.length - 1);
    if (!best || position < (this.opts.minPrefix ?? 1)) {
      this.misses++;
      return null;
    }
    this.entries = this.entries.filter((e) => e !== best);
    this.hits++;
    return { sessionId: best.sessionId, tokens: best.tokens, contextLength: best.contextLength, position };
  }

  /** Keeps a session of `routeId` holding `kept.tokens`; evicts the least recently used beyond the bounds. */
  put(routeId: number, kept: KeptSession): void {
    this.entries.push({ ...kept, routeId, usedAt: ++this.clock });
    const maxSessions = this.opts.maxSessions ?? 16;
    const maxPositions = this.opts.maxPositions ?? 65_536;
    this.entries.sort((a, b) => b.usedAt - a.usedAt);
    let positions = 0;
    const keep: Entry[] = [];
    for (const e of this.entries) {
      positions += e.contextLength;
      if (keep.length < maxSessions && positions <= maxPositions) keep.push(e);
      else this.opts.evict(e.routeId, e.sessionId);
    }
    this.entries = keep;
  }

  /** Forgets a session (closed or failed elsewhere). */
  drop(sessionId: string): void {
    this.entries = this.entries.filter((e) => e.sessionId !== sessionId);
  }

  /** Evicts every session kept on `routeId` (or all). */
  clear(routeId?: number): void {
    for (const e of this.entries) if (routeId === undefined || e.routeId === routeId) this.opts.evict(e.routeId, e.sessionId);
    this.entries = this.entries.filter((e) => routeId !== undefined && e.routeId !== routeId);
  }

  get size(): number {
    return this.entries.length;
  }
}

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}
