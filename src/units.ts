// Byte sizes as people type them ("16GiB", "8GB", "512MiB") and as reports and the page print
// them. One rule everywhere (CLI, page, components): GB, MB, kB are powers of 10, GiB, MiB, KiB
// powers of 2, a bare number is bytes; a lone "G" or "M" is refused as ambiguous.

const UNITS: Record<string, number> = {
  b: 1,
  kib: 1024,
  mib: 1024 ** 2,
  gib: 1024 ** 3,
  tib: 1024 ** 4,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  tb: 1e12,
};

/** Parses "16GiB", "1.5 GiB", "8GB", "4096", "2e9" (bytes); undefined when it is not a size. */
export function parseByteSize(text: string): number | undefined {
  const m = /^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  if (!m) return undefined;
  const unit = m[2]!.toLowerCase() || 'b';
  const scale = UNITS[unit];
  if (scale === undefined) return undefined;
  const n = Math.round(Number(m[1]) * scale);
  return Number.isSafeInteger(n) && n > 0 ? n : undefined;
}

/**
 * 1536 → "1.50 KiB": binary units, three significant figures (two decimals below 10, one below
 * 100, none above), but never fewer than `minDecimals` (inspect prints 123.4 MiB, audit 123 MiB).
 */
export function formatBytes(n: number, minDecimals = 0): string {
  if (n < 1024) return `${Math.round(n)} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(Math.max(minDecimals, v < 10 ? 2 : v < 100 ? 1 : 0))} ${units[u]}`;
}
