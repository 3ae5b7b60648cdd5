// What a stage reports of one session besides its backend's counters: the totals over its
// steps (telemetry's StageTiming) and, when a repair asks, row hashes from its replay log.

import type { StatusQuery } from '../protocol/session.ts';
import type { StageTiming } from '../route/telemetry.ts';
import type { ReplayLog } from './replay-log.ts';

/** A session's totals on a stage (ms, bytes), as the stage keeps them. */
export interface StepTotals {
  steps: number;
  computeMs: number;
  downstreamMs: number;
  handleMs: number;
  bytesIn: number;
  bytesOut: number;
}

/** The totals as telemetry reports them (ms to the µs), and the hashes `query` asks for. */
export function sessionCounters(stage: number, t: StepTotals, log: ReplayLog, query: StatusQuery): { timing: StageTiming; sentHashes?: number[]; receivedHashes?: number[] } {
  const round = (x: number): number => Math.round(x * 1000) / 1000;
  const timing: StageTiming = {
    stage,
    steps: t.steps,
    computeMs: round(t.computeMs),
    downstreamMs: round(t.downstreamMs),
    overheadMs: round(Math.max(0, t.handleMs - t.computeMs - t.downstreamMs)),
    bytesIn: t.bytesIn,
    bytesOut: t.bytesOut,
  };
  return {
    timing,
    ...(query.sentHashes ? { sentHashes: log.sentHashes(query.sentHashes[0], query.sentHashes[1]) } : {}),
    ...(query.receivedHashes ? { receivedHashes: log.receivedHashes(query.receivedHashes[0], query.receivedHashes[1]) } : {}),
  };
}
