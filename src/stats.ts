// Small statistics the server and the benchmarks share.

/** The middle value of `xs`; of an even count, the mean of the two middle ones; NaN of none. */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length === 0 ? NaN : s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}
