// What the session manager and the routes it runs on share: a route as the manager sees it
// (its links, peers, repair, hops), a session's public summary and the manager's own record of
// it, the manager's options, limits and timings, and its small rules (the session-count check,
// the failure error, the step timeout, when a session is quiet).
// The manager is ./sessions.ts; the server's Route implements RouteHandle.

import { MeshError } from '../errors.ts';
import { FrameType, makeFrame } from '../protocol/frame.ts';
import { decodeJson } from '../protocol/payload.ts';
import type { StepTiming } from '../protocol/payload.ts';
import type { SessionOpenBody } from '../protocol/session.ts';
import type { FrameLink } from '../transport/link.ts';
import type { HistoryEntry } from './repair.ts';
import type { PrefillPipeline } from './prefill-pipeline.ts';
import type { Speculation, SpeculationStats } from './speculation.ts';
import type { RingAhead, RingStats } from './ring-ahead.ts';
import type { SessionFailure, SessionLifecycle, SessionState } from './session-state.ts';
import type { HopLink, HopTelemetry } from './telemetry.ts';

/** A route's repair in progress: which stages lost their peer, since when, and when it ends. */
export interface RouteRepair {
  stages: number[];
  /** when the first loss was seen (Date.now()) */
  since: number;
  /** resolves once every stage has a ready peer again; rejects with the error that ends the repair (no replacement in time) */
  done: Promise<void>;
}

/** What the session manager needs from a route. */
export interface RouteHandle {
  readonly id: number;
  /** data link into stage 0 */
  entry(): FrameLink;
  /** control links to every stage, in order; null where the stage's peer is gone */
  stageLinks(): Array<FrameLink | null>;
  /** who serves each stage, for status and error messages */
  stagePeers(): string[];
  /** the most positions a session may declare (the model's context), when known */
  readonly contextLimit?: number | undefined;
  /** each stage's backend kind (how a repair may batch its replay) */
  stageBackends?(): string[];
  /** the repair under way, if a stage lost its peer and a replacement is coming */
  repair?(): RouteRepair | null;
  /** a step took too long: find the stage that stopped answering and treat it as lost */
  suspectStall?(): Promise<void>;
  /** how each hop is carried (webrtc, relay, ws, …), when the route knows */
  hops?(): HopLink[];
  /** every stage takes FrameFlag.ReturnDirect and the last one reaches the session manager one-way (deliverReturn) */
  directReturn?(): boolean;
  /** the one-way path's N + 1 hops' estimated one-way latencies (ms: server → stage 0, stage k → k + 1, last → server), to share a step's wire time by (token-return.ts) */
  hopLatencyMs?(): number[];
  /** the last stage reaches stage 0 directly: a session may take the ring (FrameFlag.Ring, ring-ahead.ts) */
  ring?(): boolean;
  /** every stage takes FrameFlag.Verify: the session manager may speculate (speculation.ts) */
  verify?(): boolean;
  /** a single-token decode step that ran alone on the route: each stage's timing record (step-observer.ts) */
  observeStep?(records: readonly StepTiming[]): void;
}

export interface SessionInfo {
  sessionId: string;
  routeId: number;
  state: SessionState;
  position: number;
  promptTokens: number;
  generatedTokens: number;
  failure: SessionFailure | null;
  history: SessionState[];
  /** times the session was rebuilt on a repaired route */
  repairs: number;
  /** its route is being repaired: its next step waits */
  repairing: boolean;
  stages: Array<Record<string, unknown>>;
  /** each hop named with its carrier, bytes and wire time (routes that report their hops) */
  hops?: HopTelemetry[];
  /** speculative decoding's counts, for a session that speculates */
  speculation?: SpeculationStats;
  /** the ring's steps sent ahead, taken and dropped (ring-ahead.ts) */
  ring?: RingStats;
}

export interface SessionManagerOptions {
  /** an idle session expires after this long (ms) */
  idleTtlMs?: number;
  /** how often to look for idle sessions (ms) */
  sweepMs?: number;
  /** finished sessions kept for status queries */
  keepFinished?: number;
  /** a step that gets no answer within this long makes the route look for a stalled stage (ms) */
  stepTimeoutMs?: number;
  /** a status query waits this long for each stage (ms) */
  statusTimeoutMs?: number;
  onChange?: (sessionId: string, state: SessionState) => void;
  /** most tokens a Prefill frame may carry (default 512) */
  maxFrameTokens?: number;
  /** most live sessions one client (a connection, or a principal when known) may hold (default 16) */
  maxSessionsPerClient?: number;
  /** most live sessions on one route (default 64, the stages' own default) */
  maxSessionsPerRoute?: number;
  /** drafts per route pass for greedy sessions that do not say (`serve --speculate N`; default 0: off) */
  speculate?: number;
}

/** Defaults of the session manager's limits (docs/ARCHITECTURE.md lists them). */
export const SESSION_LIMITS = { maxFrameTokens: 512, maxSessionsPerClient: 16, maxSessionsPerRoute: 64 };

/** Who holds a live session: its route, the connection that opened it, and its principal (an API key's id). */
export interface SessionHolder {
  routeId: number;
  owner: unknown;
  principal: string | null;
}

/** SESSION_LIMIT (429) when the client (its principal, else its connection) or the route holds as many live sessions as it may. */
export function checkSessionLimits(live: readonly SessionHolder[], next: SessionHolder, opts: Pick<SessionManagerOptions, 'maxSessionsPerClient' | 'maxSessionsPerRoute'>): void {
  const perClient = opts.maxSessionsPerClient ?? SESSION_LIMITS.maxSessionsPerClient;
  const perRoute = opts.maxSessionsPerRoute ?? SESSION_LIMITS.maxSessionsPerRoute;
  const mine = live.filter((x) => (next.principal !== null ? x.principal === next.principal : next.owner !== undefined && x.owner === next.owner)).length;
  const onRoute = live.filter((x) => x.routeId === next.routeId).length;
  if (mine >= perClient) throw new MeshError('SESSION_LIMIT', `this client holds ${mine} live sessions, its limit; close one first`, { limit: perClient, retryAfterS: 1 });
  if (onRoute >= perRoute) throw new MeshError('SESSION_LIMIT', `route ${next.routeId} runs ${onRoute} sessions, its limit`, { limit: perRoute, retryAfterS: 1 });
}

/** The error a client gets for a session that failed: its recorded cause, naming the stage. */
export function failureError(f: SessionFailure): MeshError {
  return new MeshError(f.code, f.message, f.stage !== undefined ? { stage: f.stage } : {});
}

/** `p`, or STAGE_STALLED after `ms` (the request itself is left to settle on its own). */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new MeshError('STAGE_STALLED', `${what} within ${ms} ms`)), ms)));
  p.catch(() => undefined);
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** One session as the manager keeps it (sessions.ts). */
export interface Session {
  life: SessionLifecycle;
  route: RouteHandle;
  position: number;
  promptTokens: number;
  generated: number;
  /** the owner's handle (a client connection), so a disconnect can cancel its sessions */
  owner: unknown;
  /** who opened it (an API key's id), for per-client limits and who may see or close it */
  principal: string | null;
  /** prompt tokens the client announced, for progress */
  promptLength: number | null;
  /** called when the session fails or its route starts a repair, with the stage lost where known (a step waiting to learn why) */
  onFail: Set<(stage?: number) => void>;
  /** the open body, for opening the session on a replacement stage */
  body: SessionOpenBody;
  /** every frame sent into stage 0, in order (what a new stage 0 replays, and what is sent again when the last stage never answered) */
  history: HistoryEntry[];
  /** history[0, confirmedEntries) reached the last stage: every stage holds positions [0, confirmedPosition) */
  confirmedEntries: number;
  confirmedPosition: number;
  /** Token replies confirmed: the last stage's sampler draws */
  confirmedDraws: number;
  /** the peer of each stage when this session last had its KV there */
  peers: string[];
  /** steps and repairs of one session run one at a time */
  lock: Promise<unknown>;
  /** the route repair this session last heard of (its `since` dates the repair) */
  repairSeen: RouteRepair | null;
  repairs: number;
  /** a step of this session waits for the route's repair (it is not in flight: a hand-over need not wait for it) */
  parked: boolean;
  /** told when the session parks */
  onPark: Set<() => void>;
  /** kept idle for reuse (KV reuse across requests): counted by no client's session limit until a request continues it */
  kept?: boolean;
  /** prefill chunks sent on without waiting, and their answers (prefill-pipeline.ts) */
  pipe: PrefillPipeline;
  /** per stage, its hop's share of the wire time of the one-way steps that carried timings (token-return.ts), summed (ms) */
  hopWireMs: number[];
  /** speculative decoding, for a greedy session where the server or the session asks for it (speculation.ts) */
  spec: Speculation | null;
  /** the ring, for a session that opened with tokenPath 'ring' (ring-ahead.ts) */
  ring: RingAhead | null;
}

/** Step errors that a stage leaving causes downstream of the news: the hop to it broke, or a stage before it already dropped the session. */
export const LOSS_SYMPTOMS = new Set(['STAGE_UNREACHABLE', 'SESSION_UNKNOWN', 'LINK_CLOSED', 'LINK_FAILED', 'STAGE_STALLED', 'STAGE_LOST', 'ROUTE_NOT_READY']);

/**
 * A step unanswered this long makes the route look for a stalled stage (ms): it probes its
 * stages with a Status each, which a live stage answers at once however long its compute runs,
 * so a short deadline costs a few small frames per overdue step and no false alarm; a stopped
 * stage is found here before its heartbeat times out.
 */
export const DEFAULT_STEP_TIMEOUT_MS = 1_000;
/** How long a status query waits for each stage (ms): a stalled stage must not stall the answer. */
export const DEFAULT_STATUS_TIMEOUT_MS = 1_000;
/** Repairs one step may wait through before its error stands. */
export const MAX_REPAIR_ATTEMPTS = 5;

/** How long a step that failed with a loss symptom waits for the server to hear that a stage left (ms). */
export const LOSS_NEWS_GRACE_MS = 2000;

/** Events kept per session so a late subscriber still sees progress (a finished one: its last 32). */
export const EVENT_BUFFER = 256;
export const FINISHED_EVENTS = 32;

/**
 * Resolves once the session's step or repair so far has finished, or its step parks on the
 * route's repair: a parked step is not in flight, and waiting for it would wait for ourselves
 * (a graceful leave's hand-over is part of the repair that step waits for).
 */
export function quiet(s: Session): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (): void => {
      s.onPark.delete(done);
      resolve();
    };
    if (s.parked) return resolve();
    s.onPark.add(done);
    // pipelined prefill chunks still computing on stage 0 count as in flight
    void s.lock.then(() => s.pipe.idle()).then(done, done);
  });
}

/** Resolves when `s` fails or after `ms`, whichever is first. */
export function failureWithin(s: Session, ms: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      s.onFail.delete(done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    s.onFail.add(done);
  });
}

/** Every stage's own status of a session (a stage that does not answer within `timeoutMs`: unreachable, with why). */
export function stageStatuses(route: RouteHandle, sessionId: string, timeoutMs: number): Promise<Array<Record<string, unknown>>> {
  const peers = route.stagePeers();
  return Promise.all(
    route.stageLinks().map(async (l, i) => {
      if (!l) return { stage: i, peer: peers[i], reachable: false, kvBytes: 0 };
      try {
        const r = await withTimeout(l.request(makeFrame({ type: FrameType.Status, routeId: route.id, sessionId })), timeoutMs, `stage ${i} did not answer`);
        return { peer: peers[i], reachable: true, ...decodeJson<Record<string, unknown>>(r.payload) };
      } catch (e) {
        return { stage: i, peer: peers[i], reachable: false, kvBytes: 0, error: (e as Error).message };
      }
    }),
  );
}
