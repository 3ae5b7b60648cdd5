// Typed telemetry events: one schema for the server, peers, the CLI and the UI. Every event
// names its kind in `type`; times are in milliseconds, sizes in bytes.

import type { SpeculationStats } from './speculation.ts';
import type { RingStats } from './ring-ahead.ts';
import type { SampledLogprob, StepTiming } from '../protocol/payload.ts';
import type { CandidatePair } from '../protocol/control.ts';

export interface StageTiming {
  stage: number;
  /** steps this stage ran for the session */
  steps: number;
  /** time in the backend's forward pass */
  computeMs: number;
  /** time waiting for the next stage's answer (transfer + everything downstream) */
  downstreamMs: number;
  /** time from receiving a frame to answering it, minus compute and downstream: decode/encode, queueing */
  overheadMs: number;
  /** hidden-state bytes received from the previous stage and sent to the next, whole frames */
  bytesIn: number;
  bytesOut: number;
}

/** One stage's part of one step (prefill chunk or decode step). */
export interface StepStageTiming {
  stage: number;
  computeMs: number;
  /** on the wire to the next stage and back, (de)serialisation included; 0 on the last stage */
  transferMs: number;
  /** waiting behind other frames on the connection */
  queueMs: number;
  /** everything else on this stage: decoding, encoding, bookkeeping */
  overheadMs: number;
  bytesIn: number;
  bytesOut: number;
}

/** Turns the trailer records of one reply into a per-stage breakdown. */
export function stepBreakdown(records: readonly StepTiming[]): StepStageTiming[] {
  const byStage = [...records].sort((a, b) => a.stage - b.stage);
  const ms = (us: number): number => Math.round(us) / 1000;
  return byStage.map((r, i) => {
    const next = byStage[i + 1];
    return {
      stage: r.stage,
      computeMs: ms(r.computeUs),
      transferMs: next ? ms(Math.max(0, r.downstreamUs - next.handleUs)) : 0,
      queueMs: ms(r.queueUs),
      overheadMs: ms(Math.max(0, r.handleUs - r.computeUs - r.downstreamUs - r.queueUs)),
      bytesIn: r.bytesIn,
      bytesOut: r.bytesOut,
    };
  });
}

/** How one hop of a route is carried (from the route's stage reports). */
export interface HopLink {
  from: number;
  to: number;
  fromPeer: string;
  toPeer: string;
  /** webrtc | relay | ws | http */
  kind: string;
  /** for a data channel: the selected ICE candidate pair */
  candidatePair: CandidatePair | null;
}

/** One hop of a session: how it was carried, the hidden-state bytes it moved and its time on the wire. */
export interface HopTelemetry extends HopLink {
  /** whole frames sent over the hop for this session */
  bytes: number;
  /** wire time summed over the session's steps: the sender's downstream time minus the receiver's handling, plus the hop's share of the one-way steps' wire time */
  transferMs: number;
  steps: number;
}

/**
 * Names each hop of a session with its carrier, bytes and time, from the stages' timings —
 * which see no downstream time on the one-way token path, whose steps' wire time the session
 * manager shares among the hops instead (`oneWayMs`, per sending stage).
 */
export function hopTelemetry(stages: ReadonlyArray<Record<string, unknown>>, links: readonly HopLink[], oneWayMs: readonly number[] = []): HopTelemetry[] {
  const t = (i: number): StageTiming | undefined => stages[i]?.timing as StageTiming | undefined;
  return links.map((l) => {
    const a = t(l.from);
    const b = t(l.to);
    const handled = b ? b.computeMs + b.downstreamMs + b.overheadMs : 0;
    const measured = a ? Math.max(0, a.downstreamMs - handled) : 0;
    return { ...l, bytes: a?.bytesOut ?? 0, transferMs: Math.round((measured + (oneWayMs[l.from] ?? 0)) * 1000) / 1000, steps: a?.steps ?? 0 };
  });
}

export type TelemetryEvent =
  | { type: 'route_planned'; routeId: number; stages: Array<{ stage: number; peerId: string; start: number; end: number }> }
  | { type: 'stage_loading'; routeId: number; stage: number; bytesDone: number; bytesTotal: number }
  | { type: 'stage_ready'; routeId: number; stage: number; loadMs: number; bytesRead: number }
  | { type: 'route_status'; routeId: number; status: string; reason: string | null }
  | { type: 'session_opened'; sessionId: string; routeId: number }
  | { type: 'prefill_progress'; sessionId: string; tokensDone: number; tokensTotal: number | null }
  | { type: 'token'; sessionId: string; id: number; text: string; position: number; logprob?: SampledLogprob }
  | { type: 'step_timing'; sessionId: string; position: number; stages: StepStageTiming[] }
  | {
      type: 'session_summary';
      sessionId: string;
      promptTokens: number;
      generatedTokens: number;
      timeToFirstTokenMs: number;
      promptTokS: number;
      decodeTokS: number;
      /** whole-frame bytes per token on each hop (stage k → k+1) during decode */
      bytesPerHop: number[];
      stages: StageTiming[];
      /** speculative decoding's counts (route passes, drafts proposed and accepted, tokens), where the session speculated */
      speculation?: SpeculationStats;
      /** the ring's steps sent ahead, taken and dropped, where the session took the ring */
      ring?: RingStats;
    }
  | { type: 'session_state'; sessionId: string; state: string }
  /** a stage's peer was lost (left, stopped answering, failed); sessionId absent on the room's stream */
  | { type: 'stage_lost'; sessionId?: string; routeId: number; stage: number; peerId: string; cause: string }
  /** the route is getting a new peer for these stages; the session's steps wait */
  | { type: 'route_repairing'; sessionId?: string; routeId: number; stages: number[]; replacementPeer?: string; warm?: boolean }
  /** the session was rebuilt on the new peers: tokens replayed into them, and the time from the loss to now */
  | {
      type: 'route_repaired';
      sessionId?: string;
      routeId: number;
      stages: number[];
      peers: string[];
      tokensReplayed: number;
      bytesReplayed: number;
      repairMs: number;
      /** first position whose hidden state from a new stage differs from what the lost peer had sent (null: none) */
      firstDivergentPosition: number | null;
      divergenceChecked: boolean;
    }
  /** a frame-API client's session went on after its link to the instance dropped (route/resuming-link.ts): opened again on the room's route, its tokens replayed; sessionId is the caller's, wireSessionId the one it runs under now */
  | { type: 'session_resumed'; sessionId: string; wireSessionId: string; routeId: number; previousRouteId: number; position: number; tokensReplayed: number; replayMs: number; resumeMs: number }
  | { type: 'error'; sessionId?: string; code: string; message: string; stage?: number };

export type TelemetryListener = (e: TelemetryEvent) => void;
