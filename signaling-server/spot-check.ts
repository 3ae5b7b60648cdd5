// A public room's spot checks, on the server: the trusted first stage's re-run of the untrusted
// stages ('expected') and the trusted last stage's view of what came out of them ('actual') meet
// here by (route, session, position, tokens). Rows that differ by more than the tolerance — as
// ‖expected − actual‖ / ‖actual‖, f16 transport and backend rounding stay far below it — mean an
// untrusted stage computed something else: the room excludes it. Pending halves are bounded in
// count and age, so a peer that reports and never matches costs nothing lasting.

import { fromBase64 } from '../src/protocol/control.ts';
import type { SpotCheckReport } from '../src/protocol/control.ts';

export interface SpotCheckVerdict {
  routeId: number;
  sessionId: string;
  position: number;
  /** ‖expected − actual‖ / ‖actual‖ */
  error: number;
  ok: boolean;
}

const MAX_PENDING = 10_000;
const MAX_AGE_MS = 60_000;

function rowOf(base64: string): Float32Array {
  const b = fromBase64(base64);
  return new Float32Array(b.buffer, b.byteOffset, Math.floor(b.byteLength / 4));
}

/** ‖a − b‖ / ‖b‖ (Infinity when the rows differ in length or hold a non-finite value). */
export function relativeError(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length || a.length === 0) return Infinity;
  let d = 0;
  let n = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]! - b[i]!;
    d += x * x;
    n += b[i]! * b[i]!;
  }
  const e = Math.sqrt(d) / Math.max(Math.sqrt(n), 1e-30);
  return Number.isFinite(e) ? e : Infinity;
}

export class SpotChecker {
  private readonly pending = new Map<string, { report: SpotCheckReport; at: number }>();
  readonly verdicts: SpotCheckVerdict[] = [];
  passed = 0;
  failed = 0;

  constructor(
    readonly tolerance: number,
    private readonly onVerdict: (v: SpotCheckVerdict) => void,
  ) {}

  /** One half of a check; the verdict once both halves are in. */
  report(r: SpotCheckReport): SpotCheckVerdict | null {
    const key = `${r.routeId}:${r.sessionId}:${r.position}:${r.nTokens}`;
    const other = this.pending.get(key);
    if (!other || other.report.role === r.role) {
      this.evict();
      this.pending.set(key, { report: r, at: Date.now() });
      return null;
    }
    this.pending.delete(key);
    const [expected, actual] = r.role === 'expected' ? [r, other.report] : [other.report, r];
    const error = relativeError(rowOf(expected.row), rowOf(actual.row));
    const v: SpotCheckVerdict = { routeId: r.routeId, sessionId: r.sessionId, position: r.position, error, ok: error <= this.tolerance };
    if (v.ok) this.passed++;
    else this.failed++;
    this.verdicts.push(v);
    if (this.verdicts.length > 100) this.verdicts.shift();
    this.onVerdict(v);
    return v;
  }

  private evict(): void {
    const now = Date.now();
    for (const [k, p] of this.pending) if (now - p.at > MAX_AGE_MS) this.pending.delete(k);
    while (this.pending.size >= MAX_PENDING) this.pending.delete(this.pending.keys().next().value!);
  }
}
