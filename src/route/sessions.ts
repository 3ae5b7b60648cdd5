// Session bookkeeping for routes: opens a session on every stage, passes prefill and decode
// frames into stage 0 in position order, tracks each session's state and position, expires idle
// sessions, and repairs sessions whose route lost a stage: while the route gets a new peer for
// the stage (signaling-server/room.ts), steps wait; then the session is rebuilt on it
// (repair.ts: rewind, replay, resend) and the step in flight is sent again, so the client sees
// the same tokens and no error. Where no repair comes — or it fails — the session fails naming
// the stage, and its KV is freed on every stage still there. Fault handling lives here; stages
// only compute. The one-way token path: on a route whose stages all take ReturnDirect, a sampled
// step's Token comes from the last stage straight to `deliverReturn`, not back through every
// stage; the chain's Status answers still come, off the critical path, carrying any error.
// A greedy session may speculate (speculation.ts): a decode goes as a Verify frame with drafts.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType, makeFrame } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, decodeJson, jsonFrame, replyAddress, tokensFrame } from '../protocol/payload.ts';
import { DirectReturns } from './token-return.ts';
import { StepObserver } from './step-observer.ts';
import { SessionEvents } from './session-events.ts';
import { Speculation } from './speculation.ts';
import { RingAhead } from './ring-ahead.ts';
import type { RingRoute } from './ring-ahead.ts';
import { PrefillPipeline } from './prefill-pipeline.ts';
import { SessionLifecycle, isTerminal } from './session-state.ts';
import type { SessionFailure, SessionState } from './session-state.ts';
import { continuedBody, parseRewind, parseSessionOpen } from '../protocol/session.ts';
import type { RewindBody, SessionOpenBody } from '../protocol/session.ts';
import type { TelemetryEvent, TelemetryListener } from './telemetry.ts';
import { hopTelemetry } from './telemetry.ts';
import { historyBefore, reachedLastStage, rebuildSession, replacedStages, rewindEveryStage } from './repair.ts';
import type { HistoryEntry, RebuildResult } from './repair.ts';
import { checkSessionLimits, failureWithin, DEFAULT_STATUS_TIMEOUT_MS, stageStatuses, DEFAULT_STEP_TIMEOUT_MS, failureError, FINISHED_EVENTS, LOSS_NEWS_GRACE_MS, LOSS_SYMPTOMS, MAX_REPAIR_ATTEMPTS, quiet, SESSION_LIMITS, withTimeout } from './session-types.ts';
import type { RouteHandle, RouteRepair, Session, SessionInfo, SessionManagerOptions } from './session-types.ts';

export { SESSION_LIMITS } from './session-types.ts';
export type { RouteHandle, RouteRepair, SessionInfo, SessionManagerOptions } from './session-types.ts';

export class SessionManager {
  private sessions = new Map<string, Session>();
  private events = new SessionEvents();
  private sweeper: NodeJS.Timeout;
  /** one-way answers of steps in flight (token-return.ts) */
  private returns = new DirectReturns();
  private observer = new StepObserver(); // single-token decode steps' stage timings, to their route
  readonly idleTtlMs: number;
  /** told of each session opened (a cluster instance records that it drives it) */
  onOpened: ((sessionId: string, routeId: number) => void) | null = null;

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
    this.events.publish(sessionId, e);
  }

  /** Replays a session's events so far (unless `fromNow`: a kept session continued by a new request), then delivers new ones until unsubscribed. */
  subscribe(sessionId: string, listener: TelemetryListener, fromNow = false): () => void {
    this.get(sessionId);
    return this.events.subscribe(sessionId, listener, fromNow);
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
      case FrameType.Rewind:
        return this.locked(this.get(f.sessionId), () => this.continueAt(f));
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
    const live = [...this.sessions.values()].filter((x) => !isTerminal(x.life.state)).map((x) => ({ routeId: x.route.id, owner: x.kept ? undefined : x.owner, principal: x.kept ? null : x.principal }));
    checkSessionLimits(live, { routeId: route.id, owner, principal }, this.opts);
    if (route.contextLimit !== undefined && body.contextLength > route.contextLimit) {
      throw new MeshError('BAD_REQUEST', `session open: contextLength ${body.contextLength} exceeds the model's context of ${route.contextLimit}`, { field: 'contextLength', limit: route.contextLimit });
    }
    // a session opened while the route is being repaired opens on the repaired route
    await route.repair?.()?.done;
    const s: Session = { // (confirmedDraws: a session opened again elsewhere, resuming-link.ts, samples on after its draws)
      life: new SessionLifecycle(sessionId), route, position: 0, promptTokens: 0, generated: 0, owner, principal, promptLength: body.promptLength ?? null, onFail: new Set(),
      body, history: [], confirmedEntries: 0, confirmedPosition: 0, confirmedDraws: body.draws ?? 0, peers: route.stagePeers(), lock: Promise.resolve(), repairSeen: null, repairs: 0, parked: false, onPark: new Set(), pipe: new PrefillPipeline(), hopWireMs: [], spec: Speculation.forSession(body, this.opts.speculate),
      ring: null,
    };
    if (body.tokenPath === 'ring' && !s.spec) s.ring = new RingAhead(routeId, sessionId, this.ringRoute(s)); // (a speculating session verifies drafts instead)
    this.sessions.set(sessionId, s);
    this.prune();
    this.opts.onChange?.(sessionId, 'opening');
    this.onOpened?.(sessionId, routeId);
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

  /** Sends a prefill chunk or decode step into stage 0 and returns stage n−1's answer (across a repair: sent again). */
  private async step(f: Frame): Promise<Frame> {
    const maxTokens = this.opts.maxFrameTokens ?? SESSION_LIMITS.maxFrameTokens;
    if (f.nTokens > maxTokens) throw new MeshError('FRAME_TOO_MANY_TOKENS', `frame token count: ${f.nTokens} tokens in one frame, at most ${maxTokens} (send the prompt in chunks)`, { field: 'token count', limit: maxTokens });
    const s = this.get(f.sessionId);
    // an idle session being rebuilt on a repaired route: the step follows the rebuild
    if (s.life.state === 'repairing') await s.lock;
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
    const served = s.spec?.served(f);
    if (served) return this.answered(s, f, served);
    let reply: Frame;
    try {
      // a chunk nobody waits on goes on at once (prefill-pipeline.ts); its failure meets the next waiting step
      reply = await this.locked(s, async () => {
        const sent = s.spec ? await s.spec.prepare(s, f, maxTokens) : f;
        if (s.ring && !(s.ring.takes(sent) && s.route.ring?.())) await s.ring.settle(); // the stages back at the session's position
        s.history.push({ type: sent.type as HistoryEntry['type'], position: sent.position, tokens: decodeI32(sent.payload), flags: sent.flags });
        const answer = await this.observer.run(s.route, sent, (g) => (PrefillPipeline.takes(g, s.route) ? s.pipe.send(s.route, s.peers, g) : this.deliver(s, g)));
        return s.spec ? s.spec.answered(s, f, sent, answer) : answer;
      });
    } catch (e) {
      const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
      const stage = typeof err.details?.stage === 'number' ? err.details.stage : 0;
      if (s.life.failure) throw failureError(s.life.failure);
      if (!isTerminal(s.life.state)) await this.fail(s, { code: err.code, message: err.message, stage });
      throw new MeshError(err.code, err.message, { ...err.details, stage });
    }
    if (isTerminal(s.life.state)) {
      // closed or failed while the step was in flight: its result is void
      if (s.life.failure) throw failureError(s.life.failure);
      throw new MeshError('SESSION_CLOSED', `session ${f.sessionId} became ${s.life.state} during the step`);
    }
    if (reachedLastStage(reply)) {
      s.confirmedEntries = s.history.length;
      // (a Verify step's accepted drafts are confirmed too: speculation.ts)
      s.confirmedPosition = Math.max(s.confirmedPosition, s.position + f.nTokens);
      if (reply.type === FrameType.Token) s.confirmedDraws++;
    }
    if (f.type === FrameType.Prefill) {
      s.promptTokens += f.nTokens;
      this.publish(f.sessionId, { type: 'prefill_progress', sessionId: f.sessionId, tokensDone: s.promptTokens, tokensTotal: s.promptLength });
    }
    return this.answered(s, f, reply);
  }

  /** Step `f` answered: the session moves past it. */
  private answered(s: Session, f: Frame, reply: Frame): Frame {
    s.position += f.nTokens;
    if (reply.type === FrameType.Token) s.generated++;
    this.move(s, 'idle');
    return reply;
  }

  /**
   * The step's way through the route. A stage leaving fails the step in flight, and the news
   * races it: the step may fail at a stage that merely lost the session or at the hop to the
   * gone stage, before or after the server hears the peer's socket close. So a step that fails
   * with a loss symptom waits briefly for the news: the route repairing (then the step waits
   * for the repair and goes again, on the rebuilt session) or the session failed (its recorded
   * cause is the error).
   */
  private async deliver(s: Session, f: Frame): Promise<Frame> {
    for (let attempt = 0; ; attempt++) {
      await this.awaitRepair(s);
      try {
        if (replacedStages(s.peers, s.route.stagePeers()).length > 0) {
          const reply = await this.rebuild(s);
          if (reply) return reply; // f was the last frame the route had not answered
        }
        return await this.answerOf(s, s.pipe.after(() => this.send(s, f)));
      } catch (e) {
        const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
        if (!LOSS_SYMPTOMS.has(err.code)) throw err;
        // a repair under way, or one that already finished (a warm spare can be faster than the step's error)
        const repairing = (): boolean => !!s.route.repair?.() || replacedStages(s.peers, s.route.stagePeers()).length > 0;
        if (!s.life.failure && !repairing()) await failureWithin(s, LOSS_NEWS_GRACE_MS);
        if (s.life.failure) throw failureError(s.life.failure);
        if (!repairing() || attempt >= MAX_REPAIR_ATTEMPTS) throw err;
      }
    }
  }

  /**
   * Sends a step into stage 0. A sampled step on a route that takes the one-way path gets
   * ReturnDirect: its answer is the Token the last stage sends to `deliverReturn`, or the
   * chain's error, whichever comes first.
   */
  private send(s: Session, f: Frame): Promise<Frame> {
    const entry = s.route.entry();
    if (!(f.flags & FrameFlag.Sample) || f.flags & FrameFlag.WantLogits || s.body.tokenPath === 'climb' || !s.route.directReturn?.()) return entry.request(f);
    if (s.ring && f.type === FrameType.Decode && !(f.flags & FrameFlag.Verify) && s.route.ring?.()) return s.ring.step(f);
    return this.returns.send(entry, f, s.onFail, s.route.id, s.route.hopLatencyMs?.(), s.hopWireMs);
  }

  /** The ring's way to the session's route (ring-ahead.ts). */
  private ringRoute(s: Session): RingRoute {
    return { send: (g) => this.returns.send(s.route.entry(), g, s.onFail, s.route.id), stageLinks: () => s.route.stageLinks(), confirmedDraws: () => s.confirmedDraws, cancel: (end, why) => this.returns.cancel(s.life.sessionId, end, why), contextLength: s.body.contextLength };
  }

  /** A one-way answer (ReturnDirect): the last stage's Token, or a stage's Error; false when no step waits for it. */
  deliverReturn(frame: Frame): boolean {
    return this.returns.deliver(frame);
  }

  /** A step's reply; when none comes within the step deadline, the route looks for a stalled stage (and keeps waiting when it finds none). */
  private async answerOf<T>(s: Session, reply: Promise<T>): Promise<T> {
    const ms = this.opts.stepTimeoutMs ?? DEFAULT_STEP_TIMEOUT_MS;
    const settled = reply.then((v) => ({ v }), (e: unknown) => ({ e }));
    for (;;) {
      let timer: NodeJS.Timeout | undefined;
      const r = await Promise.race([settled, new Promise<null>((resolve) => (timer = setTimeout(() => resolve(null), ms)))]);
      clearTimeout(timer);
      if (r) {
        if ('e' in r) throw r.e;
        return r.v;
      }
      await s.route.suspectStall?.();
      if (s.route.repair?.() || s.life.failure) throw new MeshError('STAGE_STALLED', `session ${s.life.sessionId}: no answer within ${ms} ms; a stage stalled`);
    }
  }

  /** Waits for the route's repair, if one is under way (its failure is the session's). */
  private async awaitRepair(s: Session): Promise<void> {
    const repair = s.route.repair?.();
    if (!repair) return;
    if (s.repairSeen !== repair) {
      s.repairSeen = repair;
      this.publish(s.life.sessionId, { type: 'route_repairing', sessionId: s.life.sessionId, routeId: s.route.id, stages: [...repair.stages] });
    }
    s.parked = true;
    for (const wake of [...s.onPark]) wake();
    try {
      await repair.done;
    } finally {
      s.parked = false;
    }
  }

  /** Rebuilds the session on the stages whose peer changed (state `repairing` meanwhile), then sends again what the last stage never answered; returns the last reply. */
  private async rebuild(s: Session): Promise<Frame | null> {
    const was = s.life.state;
    if (isTerminal(was)) return null;
    this.move(s, 'repairing');
    try {
      return await this.rebuildNow(s);
    } finally {
      if (s.life.state === 'repairing') this.move(s, was);
    }
  }

  private async rebuildNow(s: Session): Promise<Frame | null> {
    const since = s.repairSeen?.since ?? Date.now();
    const routePeers = s.route.stagePeers();
    s.pipe.reset(); // the replay below sends every unconfirmed chunk again
    s.ring?.abandon(); // (its rewinds drop the step ahead) — and one-way from here: the new stages start at ring generation 0
    s.ring = null;
    const result: RebuildResult = await rebuildSession(
      { sessionId: s.life.sessionId, routeId: s.route.id, body: s.body, history: s.history, confirmedEntries: s.confirmedEntries, confirmedPosition: s.confirmedPosition, confirmedDraws: s.confirmedDraws, peers: s.peers },
      s.route.stageLinks(),
      routePeers,
      s.route.stageBackends?.() ?? [],
    );
    s.peers = routePeers;
    s.repairs++;
    this.publish(s.life.sessionId, {
      type: 'route_repaired', sessionId: s.life.sessionId, routeId: s.route.id, stages: result.stages, peers: result.peers,
      tokensReplayed: result.tokensReplayed, bytesReplayed: result.bytesReplayed, repairMs: Date.now() - since,
      firstDivergentPosition: result.firstDivergentPosition, divergenceChecked: result.divergenceChecked,
    });
    let reply: Frame | null = null;
    const at = { routeId: s.route.id, sessionId: s.life.sessionId };
    for (const h of s.history.slice(s.confirmedEntries)) reply = await this.answerOf(s, s.route.entry().request(tokensFrame(h.type, at, h.position, h.tokens, h.flags)));
    return reply;
  }

  /** A client continues an idle session from position p (KV reuse: a chat turn sharing the first p tokens): every stage forgets positions from p on and takes the new sampler settings; the kept history is cut at p. */
  private async continueAt(f: Frame): Promise<Frame> {
    const s = this.get(f.sessionId);
    if (s.life.state !== 'idle') throw new MeshError('SESSION_BAD_STATE', `session ${f.sessionId} is ${s.life.state}; only an idle session continues at a new position`);
    if (f.routeId !== s.route.id) throw new MeshError('FRAME_BAD_ROUTE', `frame route id: session ${f.sessionId} runs on route ${s.route.id}, not ${f.routeId}`, { field: 'route id' });
    if (f.position > s.position) throw new MeshError('POSITION_MISMATCH', `session ${f.sessionId} holds ${s.position} positions; cannot continue at ${f.position}`, { expected: s.position, got: f.position });
    const body: RewindBody = { ...parseRewind(decodeJson(f.payload)), draws: 0 };
    const links = s.route.stageLinks();
    try {
      await this.answerOf(s, s.pipe.drain()); // the pipelined chunks before it went well
      await s.ring?.settle();
      await rewindEveryStage(links, { routeId: s.route.id, sessionId: f.sessionId }, f.position, body);
    } catch (e) {
      const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
      await this.fail(s, { code: err.code, message: `continuing the session failed: ${err.message}`, ...(typeof err.details?.stage === 'number' ? { stage: err.details.stage } : {}) });
      throw err;
    }
    s.kept = false;
    s.history = historyBefore(s.history, f.position);
    s.position = s.confirmedPosition = f.position;
    s.confirmedEntries = s.history.length;
    s.confirmedDraws = 0;
    s.body = continuedBody(s.body, body);
    s.spec = Speculation.forSession(s.body, this.opts.speculate); // the new turn's sampler says whether it may
    return jsonFrame(FrameType.Status, replyAddress(f), this.brief(f.sessionId));
  }

  /** Runs `fn` after the session's previous step or repair. */
  private locked<T>(s: Session, fn: () => Promise<T>): Promise<T> {
    const run = s.lock.then(fn, fn);
    s.lock = run.catch(() => undefined);
    return run;
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

  /**
   * Stage `stage` of `routeId` lost its peer. With a repair coming (`repairing`), live sessions
   * hear of it and their steps wait for the repair; without one, they fail naming the stage,
   * the peer and the cause.
   */
  async stageLost(routeId: number, stage: number, reason: string, opts: { peerId?: string; repairing?: boolean } = {}): Promise<void> {
    const hit = [...this.sessions.values()].filter((s) => s.route.id === routeId && !isTerminal(s.life.state));
    for (const s of hit) {
      this.publish(s.life.sessionId, { type: 'stage_lost', sessionId: s.life.sessionId, routeId, stage, peerId: opts.peerId ?? s.peers[stage] ?? '?', cause: reason });
      if (opts.repairing) for (const wake of [...s.onFail]) wake(stage);
    }
    if (opts.repairing) return;
    await Promise.all(hit.map((s) => this.fail(s, { code: 'STAGE_LOST', message: `stage ${stage} (${opts.peerId ?? s.peers[stage] ?? '?'}) left: ${reason}`, stage })));
  }

  /** The route's repair is done: idle sessions are rebuilt now, so their next step does not wait for it. */
  routeRepaired(routeId: number): void {
    for (const s of this.sessions.values()) {
      if (s.route.id !== routeId || isTerminal(s.life.state)) continue;
      void this.locked(s, async () => {
        if (isTerminal(s.life.state) || replacedStages(s.peers, s.route.stagePeers()).length === 0) return;
        await this.rebuild(s);
      }).catch((e: unknown) => {
        const err = e instanceof MeshError ? e : new MeshError('STAGE_FAILED', String(e));
        return this.fail(s, { code: err.code, message: `repairing the session failed: ${err.message}`, ...(typeof err.details?.stage === 'number' ? { stage: err.details.stage } : {}) });
      });
    }
  }

  /** Resolves once every step and repair of the route's sessions so far has finished (a graceful hand-over waits for this). */
  async settled(routeId: number): Promise<void> {
    await Promise.all([...this.sessions.values()].filter((s) => s.route.id === routeId).map(quiet));
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
    const stages = await stageStatuses(s.route, sessionId, this.opts.statusTimeoutMs ?? DEFAULT_STATUS_TIMEOUT_MS);
    return { ...brief, stages, ...(s.route.hops ? { hops: hopTelemetry(stages, s.route.hops(), s.hopWireMs) } : {}) };
  }

  brief(sessionId: string): Omit<SessionInfo, 'stages'> {
    const s = this.get(sessionId);
    return {
      sessionId, routeId: s.route.id, state: s.life.state, position: s.position,
      promptTokens: s.promptTokens, generatedTokens: s.generated, failure: s.life.failure,
      history: [...s.life.history],
      repairs: s.repairs,
      repairing: s.route.repair?.() ? true : false,
      ...(s.spec ? { speculation: { ...s.spec.stats } } : {}),
      ...(s.ring?.stats.sentAhead ? { ring: { ...s.ring.stats } } : {}),
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

  /** Live sessions (on route `routeId`, when given); `kept`: only those kept idle for reuse (KV reuse's prefix cache), which no client's session limit counts. */
  liveCount(kept = false, routeId?: number): number {
    return [...this.sessions.values()].filter((s) => !isTerminal(s.life.state) && (!kept || s.kept) && (routeId === undefined || s.route.id === routeId)).length;
  }

  /** The session stays open, idle, for a later request to continue (a prefix cache holds it): no client's any more until continued. */
  keep(sessionId: string): void {
    this.get(sessionId).kept = true;
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
    if (!isTerminal(to)) return;
    s.ring?.abandon();
    // kept for status queries only: its replay history goes, and all but its last events
    s.history = [];
    s.confirmedEntries = 0;
    this.events.trim(s.life.sessionId, FINISHED_EVENTS);
  }

  private async fail(s: Session, failure: SessionFailure): Promise<void> {
    if (isTerminal(s.life.state)) return;
    s.life.fail(failure);
    for (const wake of [...s.onFail]) wake(failure.stage);
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
    const finished = [...this.sessions.entries()].filter(([, s]) => isTerminal(s.life.state));
    for (const [id] of finished.slice(0, Math.max(0, finished.length - (this.opts.keepFinished ?? 1000)))) {
      this.sessions.delete(id);
      this.events.forget(id);
    }
  }
}
