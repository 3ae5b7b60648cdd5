// Human-readable numbers for the page: bytes, durations, rates.

import { formatBytes as formatByteSize, parseByteSize } from '../units.ts';

/** Bytes for the page: the one rule of src/units.ts ('–' when unknown). */
export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–';
  return n < 0 ? `-${formatByteSize(-n)}` : formatByteSize(n);
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

/** Parses a size the way the CLI does (src/units.ts); null when it is not one. */
export function parseBytes(text: string): number | null {
  return parseByteSize(text) ?? null;
}
