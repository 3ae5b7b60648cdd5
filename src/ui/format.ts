// Human-readable numbers for the page: bytes, durations, rates.

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}

export function formatMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '–';
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  return `${(ms / 1000).toFixed(2)} s`;
}

export function formatRate(perSecond: number | null | undefined, unit: string): string {
  if (perSecond === null || perSecond === undefined || !Number.isFinite(perSecond)) return '–';
  return `${perSecond.toFixed(perSecond < 10 ? 2 : 1)} ${unit}`;
}

/** Parses "4GiB", "512 MiB", "2e9" into bytes; null when it is not a size. */
export function parseBytes(text: string): number | null {
  const m = /^\s*([\d.]+(?:e\d+)?)\s*([kmgt]i?b?|b)?\s*$/i.exec(text);
  if (!m) return null;
  const n = Number(m[1]);
  if (!Number.isFinite(n)) return null;
  const unit = (m[2] ?? 'b').toLowerCase()[0]!;
  const pow = { b: 0, k: 1, m: 2, g: 3, t: 4 }[unit as 'b'] ?? 0;
  return Math.round(n * 1024 ** pow);
}
