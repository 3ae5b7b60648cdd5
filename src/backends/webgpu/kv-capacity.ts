// How a session's KV cache grows, shared by the stage (which allocates) and the page-side
// backend (which reports kvBytes without asking the worker). Same rule as the CPU reference's
// KvCache: start at 256 positions, double as needed, never past the context length.

/** Positions a new session's KV cache holds before it first grows. */
export const INITIAL_KV_POSITIONS = 256;

/** Capacity after making room for `needed` positions, growing from `current` (0: a new cache). */
export function kvCapacity(current: number, needed: number, contextLength: number): number {
  let cap = current > 0 ? current : Math.min(contextLength, INITIAL_KV_POSITIONS);
  while (cap < needed) cap *= 2;
  return Math.min(cap, contextLength);
}
