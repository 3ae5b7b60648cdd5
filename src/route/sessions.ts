// Session bookkeeping for routes: opens a session on every stage, passes prefill and decode
// frames into stage 0 in position order, tracks each session's state and position, expires
// idle sessions, and — when a step fails or a stage leaves — fails the session naming the
// stage and frees the KV cache on every stage that is still there. Fault handling lives here
// and nowhere else; stages only compute.

import { MeshError } from '../errors.ts';
import { FrameType, makeFrame } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeJson, jsonFrame, replyAddress } from '../protocol/payload.ts';
import type { FrameLink } from '../transport/link.ts';
import { SessionLifecycle, isTerminal } from './session-state.ts';
import type { SessionFailure, SessionState } from './session-state.ts';
import { parseSessionOpen } from '../protocol/session.ts';
import type { SessionOpenBody } from '../protocol/session.ts';
import type { TelemetryEvent, TelemetryListener } from './telemetry.ts';

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
  stages: Array<Record<string, unknown>>;
}

interface Session {
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
  /** called once when the session fails (a step waiting to learn why) */
  onFail: Set<() => void>;
}

export interface SessionManagerOptions {
  /** an idle session expires after this long (ms) */
  idleTtlMs?: number;
  /** how often to look for idle sessions (ms) */
  sweepMs?: number;
  /** finished sessions kept for status queries */
  keepFinished?: number;
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

/** Step errors that a stage leaving causes downstream of the news: the hop to it broke, or a stage before it already dropped the session. */
const LOSS_SYMPTOMS = new Set(['STAGE_UNREACHABLE', 'SESSION_UNKNOWN', 'LINK_CLOSED', 'LINK_FAILED']);

/** How long a step that failed with a loss symptom waits for the server to hear that a stage left (ms). */
const LOSS_NEWS_GRACE_MS = 2000;

/** The error a client gets for a session that failed: its recorded cause, naming the stage. */
function failureError(f: SessionFailure): MeshError {
  return new MeshError(f.code, f.message, f.stage !== undefined ? { stage: f.stage } : {});
}

/** Events kept per session so a late subscriber still sees progress. */
const EVENT_BUFFER = 256;

export class SessionManager {
  private sessions = new Map<string, Session>();
  private listeners = new Map<string, Set<TelemetryListener>>();
  private buffers = new Map<string, TelemetryEvent[]>();
  private sweeper: NodeJS.Timeout;
  readonly idleTtlMs: number;

  constructor(
    private readonly resolveRoute: (routeId: number) => RouteHandle | undefined,
    private readonly opts: SessionManagerOptions = {},
  ) {
    this.idleTtlMs = opts.idleTtlMs ?? 5 * 60_000;
    this.sweeper = setInterval(() => void this.expireIdle(), opts.sweepMs ?? Math.min(1000, this.idleTtlMs / 4));
    this.sweeper.unref();
  }

  /** Adds a telemetry event to a session's stream. */
  publish(sessionId: string, e: TelemetryEvent): void {
    let buf = this.buffers.get(sessionId);
    if (!buf) this.buffers.set(sessionId, (buf = []));
    buf.push(e);
    if (buf.length > EVENT_BUFFER) buf.shift();
    for (const l of this.listeners.get(sessionId) ?? []) l(e);
  }

  /** Replays a session's events so far, then delivers new ones until unsubscribed. */
  subscribe(sessionId: string, listener: TelemetryListener): () => void {
    this.get(sessionId);
    for (const e of this.buffers.get(sessionId) ?? []) listener(e);
    let set = this.listeners.get(sessionId);
    if (!set) this.listeners.set(sessionId, (set = new Set()));
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0) this.listeners.delete(sessionId);
    };
  }

  /** Answers a client's frame (open, prefill, decode, close, status). */
  async handle(f: Frame, owner?: unknown, principal: string | null = null): Promise<Frame> {
    switch (f.type) {
      case FrameType.SessionOpen: {
        const body = parseSessionOpen(decodeJson(f.payload));
        await this.open(f.routeId, f.sessionId, body, owner, principal);
        return jsonFrame(FrameType.Status, replyAddress(f), this.brief(f.sessionId));
      }
      case FrameType.Prefill:
      case FrameType.Decode:
        return this.step(f);
      case FrameType.SessionClose:
        await this.close(f.sessionId, 'closed');
        return jsonFrame(FrameType.Status, replyAddress(f), this.brief(f.sessionId));
      case FrameType.Status:
        return jsonFrame(FrameType.Status, replyAddress(f), await this.info(f.sessionId));
      default:
        throw new MeshError('FRAME_BAD_TYPE', `frame type: a client may not send ${FrameType[f.type]} frames`, { field: 'type' });
    }
  }

  async open(routeId: number, sessionId: string, body: SessionOpenBody, owner?: unknown, principal: string | null = null): Promise<void> {
    const route = this.resolveRoute(routeId);
    if (!route) throw new MeshError('ROUTE_UNKNOWN', `no ready route ${routeId}`);
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} already exists`);
    if (/^0+$/.test(sessionId)) throw new MeshError('FRAME_BAD_SESSION', 'frame session id: the all-zero id is reserved', { field: 'session id' });
    this.checkSessionLimits(route, owner, principal);
    if (route.contextLimit !== undefined && body.contextLength > route.contextLimit) {
      throw new MeshError('BAD_REQUEST', `session open: contextLength ${body.contextLength} exceeds the model's context of ${route.contextLimit}`, { field: 'contextLength', limit: route.contextLimit });
    }
    const s: Session = { life: new SessionLifecycle(sessionId), route, position: 0, promptTokens: 0, generated: 0, owner, principal, promptLength: body.promptLength ?? null, onFail: new Set() };
    this.sessions.set(sessionId, s);
    this.prune();
    this.opts.onChange?.(sessionId, 'opening');
    this.publish(sessionId, { type: 'session_state', sessionId, state: 'opening' });
    const links = route.stageLinks();
    const openFrame = jsonFrame(FrameType.SessionOpen, { routeId, sessionId }, body);
    const results = await Promise.allSettled(
      links.map((l, i) => (l ? l.request(openFrame) : Promise.reject(new MeshError('STAGE_UNREACHABLE', `stage ${i} has no peer`, { stage: i })))),
    );
    const bad = results.findIndex((r) => r.status === 'rejected');
    if (bad >= 0) {
      const e = (results[bad] as PromiseRejectedResult).reason as MeshError;
      await this.fail(s, { code: e.code ?? 'STAGE_FAILED', message: `stage ${bad}: ${e.message}`, stage: bad });
      throw new MeshError(e.code ?? 'STAGE_FAILED', `opening session on stage ${bad} failed: ${e.message}`, { stage: bad });
    }
    this.move(s, 'idle');
  }

  /** SESSION_LIMIT (429) when the client or the route holds as many live sessions as it may. */
  private checkSessionLimits(route: RouteHandle, owner: unknown, principal: string | null): void {
    const perClient = this.opts.maxSessionsPerClient ?? SESSION_LIMITS.maxSessionsPerClient;
    const perRoute = this.opts.maxSessionsPerRoute ?? SESSION_LIMITS.maxSessionsPerRoute;
    let mine = 0;
    let onRoute = 0;
    for (const x of this.sessions.values()) {
      if (isTerminal(x.life.state)) continue;
      if (x.route.id === route.id) onRoute++;
      if (principal !== null ? x.principal === principal : owner !== undefined && x.owner === owner) mine++;
    }
    if (mine >= perClient) throw new MeshError('SESSION_LIMIT', `this client holds ${mine} live sessions, its limit; close one first`, { limit: perClient, retryAfterS: 1 });
    if (onRoute >= perRoute) throw new MeshError('SESSION_LIMIT', `route ${route.id} runs ${onRoute} sessions, its limit`, { limit: perRoute, retryAfterS: 1 });
  }

  /** Sends a prefill chunk or decode step into stage 0 and returns stage n−1's answer. */
  private async step(f: Frame): Promise<Frame> {
    const maxTokens = this.opts.maxFrameTokens ?? SESSION_LIMITS.maxFrameTokens;
    if (f.nTokens > maxTokens) throw new MeshError('FRAME_TOO_MANY_TOKENS', `frame token count: ${f.nTokens} tokens in one frame, at most ${maxTokens} (send the prompt in chunks)`, { field: 'token count', limit: maxTokens });
    const s = this.get(f.sessionId);
    if (f.routeId !== s.route.id) throw new MeshError('FRAME_BAD_ROUTE', `frame route id: session ${f.sessionId} runs on route ${s.route.id}, not ${f.routeId}`, { field: 'route id' });
    if (f.type === FrameType.Decode && s.position === 0) throw new MeshError('SESSION_BAD_STATE', `session ${f.sessionId}: decode before any prefill`);
    if (s.life.state !== 'idle') {
      s.life.begin(f.type === FrameType.Prefill ? 'prefilling' : 'decoding'); // throws the right error
    }
    if (f.position !== s.position) {
      throw new MeshError('POSITION_MISMATCH', `session ${f.sessionId} is at position ${s.position}, got a frame for position ${f.position}`, { expected: s.position, got: f.position });
    }
    s.life.begin(f.type === FrameType.Prefill ? 'prefilling' : 'decoding');
    this.opts.onChange?.(f.sessionId, s.life.state);
    let reply: Frame;
    try {
      reply = await s.route.entry().request(f);
    } catch (e) {
      const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
      const stage = typeof err.details?.stage === 'number' ? err.details.stage : 0;
      // A stage leaving fails the step in flight too, and both pieces of news race: the step
      // may fail at a stage that merely lost the session (the server already closed it there:
      // SESSION_UNKNOWN at stage 1 when stage 2 left) or at the hop to the gone stage, before or
      // after the server hears the peer's socket close. The session's recorded failure is the
      // cause: report it, waiting briefly for it when the step's error looks like a loss.
      if (!s.life.failure && LOSS_SYMPTOMS.has(err.code)) await this.failureWithin(s, LOSS_NEWS_GRACE_MS);
      if (s.life.failure) throw failureError(s.life.failure);
      if (!isTerminal(s.life.state)) await this.fail(s, { code: err.code, message: err.message, stage });
      throw new MeshError(err.code, err.message, { ...err.details, stage });
    }
    if (isTerminal(s.life.state)) {
      // closed or failed while the step was in flight: its result is void
      if (s.life.failure) throw failureError(s.life.failure);
      throw new MeshError('SESSION_CLOSED', `session ${f.sessionId} became ${s.life.state} during the step`);
    }
    s.position += f.nTokens;
    if (f.type === FrameType.Prefill) {
      s.promptTokens += f.nTokens;
      this.publish(f.sessionId, { type: 'prefill_progress', sessionId: f.sessionId, tokensDone: s.promptTokens, tokensTotal: s.promptLength });
    }
    if (reply.type === FrameType.Token) s.generated++;
    this.move(s, 'idle');
    return reply;
  }

  async close(sessionId: string, why: 'closed' | 'expired'): Promise<void> {
    const s = this.get(sessionId);
    if (isTerminal(s.life.state)) {
      if (s.life.state === 'closed' && why === 'closed') return; // closing twice is harmless
      throw new MeshError('SESSION_CLOSED', `session ${sessionId} is already ${s.life.state}`);
    }
    this.move(s, why);
    await this.releaseEverywhere(s);
  }

  /** Fails every live session on `routeId` because stage `stage` is gone. */
  async stageLost(routeId: number, stage: number, reason: string): Promise<void> {
    const hit = [...this.sessions.values()].filter((s) => s.route.id === routeId && !isTerminal(s.life.state));
    await Promise.all(hit.map((s) => this.fail(s, { code: 'STAGE_LOST', message: `stage ${stage} (${s.route.stagePeers()[stage] ?? '?'}) left: ${reason}`, stage })));
  }

  /** Cancels every live session an owner (a client connection) opened. */
  async ownerGone(owner: unknown): Promise<void> {
    const hit = [...this.sessions.values()].filter((s) => s.owner === owner && !isTerminal(s.life.state));
    await Promise.all(hit.map((s) => this.close(s.life.sessionId, 'closed').catch(() => undefined)));
  }

  async info(sessionId: string): Promise<SessionInfo> {
    const s = this.get(sessionId);
    // the state before the stage queries: a close racing them shows as not yet closed
    const brief = this.brief(sessionId);
    const links = s.route.stageLinks();
    const peers = s.route.stagePeers();
    const stages = await Promise.all(
      links.map(async (l, i) => {
        if (!l) return { stage: i, peer: peers[i], reachable: false, kvBytes: 0 };
        try {
          const r = await l.request(makeFrame({ type: FrameType.Status, routeId: s.route.id, sessionId }));
          return { peer: peers[i], reachable: true, ...decodeJson<Record<string, unknown>>(r.payload) };
        } catch (e) {
          return { stage: i, peer: peers[i], reachable: false, kvBytes: 0, error: (e as Error).message };
        }
      }),
    );
    return { ...brief, stages };
  }

  brief(sessionId: string): Omit<SessionInfo, 'stages'> {
    const s = this.get(sessionId);
    return {
      sessionId,
      routeId: s.route.id,
      state: s.life.state,
      position: s.position,
      promptTokens: s.promptTokens,
      generatedTokens: s.generated,
      failure: s.life.failure,
      history: [...s.life.history],
    };
  }

  /** Who opened the session (its principal), null when not known; SESSION_UNKNOWN when there is none. */
  principalOf(sessionId: string): string | null {
    return this.get(sessionId).principal;
  }

  state(sessionId: string): SessionState | undefined {
    return this.sessions.get(sessionId)?.life.state;
  }

  list(): Array<Omit<SessionInfo, 'stages'>> {
    return [...this.sessions.keys()].map((id) => this.brief(id));
  }

  get liveCount(): number {
    return [...this.sessions.values()].filter((s) => !isTerminal(s.life.state)).length;
  }

  async dispose(): Promise<void> {
    clearInterval(this.sweeper);
    await Promise.all([...this.sessions.values()].filter((s) => !isTerminal(s.life.state)).map((s) => this.close(s.life.sessionId, 'closed').catch(() => undefined)));
  }

  private get(sessionId: string): Session {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `frame session id: no session ${sessionId}`, { field: 'session id' });
    return s;
  }

  private move(s: Session, to: SessionState): void {
    s.life.transition(to);
    this.opts.onChange?.(s.life.sessionId, to);
    this.publish(s.life.sessionId, { type: 'session_state', sessionId: s.life.sessionId, state: to });
  }

  /** Resolves when `s` fails or after `ms`, whichever is first. */
  private failureWithin(s: Session, ms: number): Promise<void> {
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

  private async fail(s: Session, failure: SessionFailure): Promise<void> {
    if (isTerminal(s.life.state)) return;
    s.life.fail(failure);
    for (const wake of [...s.onFail]) wake();
    this.opts.onChange?.(s.life.sessionId, 'failed');
    this.publish(s.life.sessionId, { type: 'error', sessionId: s.life.sessionId, code: failure.code, message: failure.message, ...(failure.stage !== undefined ? { stage: failure.stage } : {}) });
    this.publish(s.life.sessionId, { type: 'session_state', sessionId: s.life.sessionId, state: 'failed' });
    await this.releaseEverywhere(s);
  }

  /** Sends SessionClose to every stage still there; a stage that already lost it is fine. */
  private async releaseEverywhere(s: Session): Promise<void> {
    const links = s.route.stageLinks();
    await Promise.allSettled(
      links.map((l) => (l ? l.request(makeFrame({ type: FrameType.SessionClose, routeId: s.route.id, sessionId: s.life.sessionId })) : Promise.resolve())),
    );
  }

  private async expireIdle(): Promise<void> {
    const now = Date.now();
    for (const s of this.sessions.values()) {
      if (s.life.state === 'idle' && now - s.life.changedAt >= this.idleTtlMs) {
        await this.close(s.life.sessionId, 'expired').catch(() => undefined);
      }
    }
  }

  /** Forgets the oldest finished sessions beyond the keep limit. */
  private prune(): void {
    const keep = this.opts.keepFinished ?? 1000;
    const finished = [...this.sessions.entries()].filter(([, s]) => isTerminal(s.life.state));
    for (const [id] of finished.slice(0, Math.max(0, finished.length - keep))) {
      this.sessions.delete(id);
      this.buffers.delete(id);
    }
  }
}
