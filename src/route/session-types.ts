// What the session manager and the routes it runs on share: a route as the manager sees it
// (its links, peers, repair, hops), a session's public summary, the manager's options and
// limits, and its small rules (the session-count check, the failure error, the step timeout).
// The manager is ./sessions.ts; the server's Route implements RouteHandle.

import { MeshError } from '../errors.ts';
import type { FrameLink } from '../transport/link.ts';
import type { SessionFailure, SessionState } from './session-state.ts';
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
