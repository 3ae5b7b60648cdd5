// One stage of a route, as a frame handler: it runs its backend over incoming tokens (stage 0)
// or hidden states (later stages), passes hidden states straight to the next stage, and — on
// the last stage — samples the next token (or returns logits when asked). The reply travels
// back up the chain — or, on the one-way token path (FrameFlag.ReturnDirect), the last stage
// hands the token straight to the session's owner (`returnTo`) and the stages answer each
// other with a Status off the token's critical path: N + 1 hops per token instead of 2N — on the
// ring (FrameFlag.Ring) to stage 0 too, where the next step waits for it (stage-ring.ts).
//
// Session open/close/status frames act on this stage only: the session's owner sends them to
// every stage itself, so a lost stage can never keep another stage's KV cache alive.
//
// For repair (route/repair.ts) a stage keeps, per session, the hidden states it sent downstream
// and a hash of every row it received (replay-log.ts), and answers Rewind (drop what is queued,
// forget positions from p on, reset the sampler), Resend (logged states to the next stage again
// as Replay frames) and Replay input (compute and log, send nothing on); Verify frames in
// stage-verify.ts. Fair scheduling: every forward goes through one ComputeQueue per stage, a
// frame of more than `chunkTokens` tokens in chunks, so one long prefill cannot hold the stage.

import { MeshError } from '../errors.ts';
import type { HiddenRows, StageBackend, StageInput, ShardRange } from '../backends/types.ts';
import { argmax, tokenLogprob } from '../model/sampler.ts';
import { DType, FrameFlag, FrameType, HEADER_BYTES } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, decodeJson, decodeRows, hiddenFrame, hiddenRowsFrame, jsonFrame, logitsFrame, payloadBody, replyAddress, sampledFrame, timingsOf, withTimings } from '../protocol/payload.ts';
import type { StepTiming } from '../protocol/payload.ts';
import { errorReplyFor } from '../transport/link.ts';
import type { FrameLink } from '../transport/link.ts';
import { parseResend, parseRewind, parseSessionOpen, parseStatusQuery } from '../protocol/session.ts';
import type { SamplerSettings, StatusQuery } from '../protocol/session.ts';
import { ReplayLog, rowHashes } from './replay-log.ts';
import type { BatchCounters } from './compute-queue.ts';
import type { SpotCheck } from './spot-check.ts';
import { frameChunk, hiddenRowsOf, inputSlice } from './stage-input.ts';
import { stageForward, stageQueue } from './stage-forward.ts';
import { dropRejected, forgetFrom, verifies, verifyAnswer } from './stage-verify.ts';
import { sessionCounters } from './stage-status.ts';
import { RingInbox, ringTokenFrame } from './stage-ring.ts';
import type { StepTotals } from './stage-status.ts';
import type { StageQueue } from './stage-forward.ts';
import type { SamplerFactory, StageSession, StepCost, TokenSampler } from './stage-session.ts';

export type { SamplerFactory, TokenSampler } from './stage-session.ts';
export type { StatusQuery } from '../protocol/session.ts';
type Input = StageInput | HiddenRows;

export interface StageStatus {
  stage: number;
  shard: ShardRange;
  backend: string;
  sessions: Array<{ sessionId: string; position: number; kvBytes: number; processedTokens: number[] }>;
  /** decode steps of several sessions run as one pass (./stage-forward.ts) */
  batching: BatchCounters;
}

export interface StageServiceOptions {
  backend: StageBackend;
  stage: number;
  shard: ShardRange;
  nLayer: number;
  /** the next stage, or null on the last stage */
  downstream: FrameLink | null;
  samplerFactory?: SamplerFactory;
  /** a frame of more tokens is computed in chunks of this many, other sessions' steps between them (default 64) */
  chunkTokens?: number;
  /** most tokens one Prefill or Hidden frame may carry (default 512) */
  maxFrameTokens?: number;
  /** most sessions open on this stage at once (default 64) */
  maxSessions?: number;
  /** a session with no frame for this long is released (ms, default 15 min: above the server's 5) */
  idleTtlMs?: number;
  /** public rooms: re-runs of the untrusted stages (first stage) or reports of what arrived (last) */
  spotCheck?: SpotCheck;
  /**
   * the one-way way to the session's owner: the last stage sends a ReturnDirect step's Token here,
   * not in the reply; the others answer such a step once forwarded and send a failure downstream
   * here as an Error (position = the step's end). Absent: answers climb back as replies.
   */
  returnTo?: ((token: Frame) => void) | undefined;
  /** the last stage's way to stage 0 for a Ring step's token (a Ring-flagged Status: `{token, generation}`); rejects when it does not get there */
  ring?: ((token: Frame) => Promise<unknown>) | undefined;
}

/** Defaults of the stage's limits (docs/ARCHITECTURE.md lists them). */
export const STAGE_LIMITS = { chunkTokens: 64, maxFrameTokens: 512, maxSessions: 64, idleTtlMs: 15 * 60_000 };

export class StageService {
  private sessions = new Map<string, StageSession>();
  /** payload bytes of hidden states sent downstream and received from upstream */
  bytesOut = 0;
  bytesIn = 0;
  /** whole frames (header + payload) sent downstream, and how many */
  wireBytesOut = 0;
  framesOut = 0;
  /** tokens this (last) stage sent one-way to the session's owner (ReturnDirect), and to stage 0 (Ring) */
  tokensReturned = 0;
  tokensRinged = 0;
  /** stage 0: ring steps waiting for their token, and tokens for steps not yet here */
  private readonly inbox = new RingInbox();

  private readonly queue: StageQueue;
  private readonly limits: typeof STAGE_LIMITS;
  private sweeper: ReturnType<typeof setInterval> | null = null;

  constructor(private readonly opts: StageServiceOptions) {
    this.queue = stageQueue(opts.backend);
    this.limits = {
      chunkTokens: opts.chunkTokens ?? STAGE_LIMITS.chunkTokens,
      maxFrameTokens: opts.maxFrameTokens ?? STAGE_LIMITS.maxFrameTokens,
      maxSessions: opts.maxSessions ?? STAGE_LIMITS.maxSessions,
      idleTtlMs: opts.idleTtlMs ?? STAGE_LIMITS.idleTtlMs,
    };
  }

  get isFirst(): boolean {
    return this.opts.shard.start === 0;
  }

  get isLast(): boolean {
    return this.opts.shard.end === this.opts.nLayer;
  }

  setDownstream(link: FrameLink | null): void {
    this.opts.downstream = link;
  }

  /** the one-way way to the session's owner, and (the last stage) the ring's to stage 0 */
  setReturnTo(send: ((token: Frame) => void) | undefined, ring: StageServiceOptions['ring'] = this.opts.ring): void {
    this.opts.returnTo = send;
    this.opts.ring = ring;
  }

  readonly handle = async (f: Frame): Promise<Frame> => {
    try {
      return await this.dispatch(f);
    } catch (e) {
      if (e instanceof MeshError && e.details?.stage === undefined) {
        throw new MeshError(e.code, `stage ${this.opts.stage}: ${e.message}`, { ...e.details, stage: this.opts.stage });
      }
      throw e;
    }
  };

  private async dispatch(f: Frame): Promise<Frame> {
    switch (f.type) {
      case FrameType.SessionOpen:
        return this.open(f);
      case FrameType.SessionClose:
        return this.close(f);
      case FrameType.Status:
        if (f.flags & FrameFlag.Ring) return this.ringToken(f);
        return jsonFrame(FrameType.Status, replyAddress(f), f.sessionId === '0'.repeat(32) ? this.status() : this.sessionStatus(f.sessionId, f.dtype === DType.Json ? parseStatusQuery(decodeJson(f.payload)) : {}));
      case FrameType.Rewind:
        return this.rewind(f);
      case FrameType.Resend:
        return this.resend(f);
      case FrameType.Prefill:
      case FrameType.Decode:
        this.checkFrameTokens(f);
        if (!this.isFirst) throw new MeshError('STAGE_INPUT_KIND', `stage ${this.opts.stage} takes hidden states, not token ids`);
        if (f.flags & FrameFlag.AwaitsToken) return this.ringStep(f);
        return this.compute(f, { kind: 'tokens', tokens: decodeI32(f.payload) });
      case FrameType.Hidden: {
        this.checkFrameTokens(f);
        if (this.isFirst) throw new MeshError('STAGE_INPUT_KIND', 'stage 0 takes token ids, not hidden states');
        // on the one-way path the stages before send their timing records forward in a trailer
        const carried = timingsOf(f);
        const h: Frame = { ...f, flags: f.flags & ~FrameFlag.Timings, payload: payloadBody(f) };
        this.bytesIn += h.payload.byteLength;
        this.opts.spotCheck?.actual(h, () => decodeRows(h.payload, h.dtype));
        return this.compute(h, this.opts.backend.forwardRows ? hiddenRowsOf(h) : { kind: 'hidden', hidden: decodeRows(h.payload, h.dtype), nTokens: h.nTokens }, carried);
      }
      default:
        throw new MeshError('FRAME_BAD_TYPE', `frame type: a stage does not accept ${FrameType[f.type]} frames`, { field: 'type' });
    }
  }

  /** Stage 0: a ring token from the last stage, for the step at its position (of the session's ring generation only). */
  private ringToken(f: Frame): Frame {
    if (!this.isFirst) throw new MeshError('FRAME_BAD_TYPE', `frame flags: stage ${this.opts.stage} takes no ring tokens (stage 0 does)`, { field: 'flags' });
    const ringed = this.inbox.accept(f, this.session(f.sessionId).ringGeneration);
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, position: f.position, ringed });
  }

  /**
   * Stage 0: a Decode sent ahead on the ring, answered at once (so it holds up none of the
   * session's frames behind it); it computes as a plain Decode once the last stage's token for its
   * position is here, its failure going to the owner one-way — unless a Rewind or close came first.
   */
  private ringStep(f: Frame): Frame {
    const s = this.session(f.sessionId);
    const epoch = s.epoch;
    const end = f.position + 1;
    void this.inbox
      .tokenFor(f.sessionId, f.position)
      .then((token) => this.handle({ ...f, flags: f.flags & ~FrameFlag.AwaitsToken, payload: new Uint8Array(Int32Array.of(token).buffer) }))
      .catch((e: unknown) => void (s.epoch === epoch && this.sessions.get(f.sessionId) === s && this.opts.returnTo?.({ ...errorReplyFor(f, e), position: end })));
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, position: end, awaiting: true });
  }

  /** Public rooms, the last stage: report what arrives for this session. */
  watch(sessionId: string): void {
    this.opts.spotCheck?.watch(sessionId);
  }

  private checkFrameTokens(f: Frame): void {
    if (f.nTokens > this.limits.maxFrameTokens) {
      throw new MeshError('FRAME_TOO_MANY_TOKENS', `frame token count: ${f.nTokens} tokens in one frame, this stage takes at most ${this.limits.maxFrameTokens}`, { field: 'token count', limit: this.limits.maxFrameTokens });
    }
  }

  private async open(f: Frame): Promise<Frame> {
    const body = parseSessionOpen(decodeJson(f.payload));
    if (this.sessions.has(f.sessionId)) throw new MeshError('SESSION_EXISTS', `session ${f.sessionId} is already open`);
    if (this.sessions.size >= this.limits.maxSessions) throw new MeshError('SESSION_LIMIT', `stage ${this.opts.stage} holds ${this.sessions.size} sessions, its limit`, { limit: this.limits.maxSessions, retryAfterS: 1 });
    const settings = body.sampler ?? {};
    const sample = this.samplerFor(settings, body.draws ?? 0); // bad settings are refused before the backend holds the session
    (this.sweeper ??= setInterval(() => void this.expireIdle(), Math.min(60_000, this.limits.idleTtlMs / 4))).unref?.();
    // held from now too: an engine in a worker thread opens the session after the chunk it is computing
    await this.queue.holdWhile(f.sessionId, async () => {
      await this.opts.backend.openSession(f.sessionId, { contextLength: body.contextLength });
      await this.opts.spotCheck?.open(f.sessionId, body.contextLength);
    });
    this.sessions.set(f.sessionId, {
      sample,
      settings,
      history: body.tokens ? [...body.tokens] : [],
      logprobs: body.logprobs ?? null,
      log: new ReplayLog(),
      hiddenDtype: body.hiddenDtype === 'f32' ? DType.F32 : DType.F16,
      timing: { steps: 0, computeMs: 0, downstreamMs: 0, handleMs: 0, bytesIn: 0, bytesOut: 0 },
      pipelineError: null,
      lastUsed: performance.now(),
      tentative: Infinity,
      epoch: 0,
      ringGeneration: 0,
    });
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, state: 'open', position: 0 });
  }

  /** the stage's sampler factory's sampler for the settings (greedy argmax on a stage without one); null off the last stage */
  private samplerFor(settings: SamplerSettings, draws: number): TokenSampler | null {
    if (!this.isLast) return null;
    return this.opts.samplerFactory ? this.opts.samplerFactory(settings, draws) : (logits) => argmax(logits);
  }

  /** Rewind: positions from f.position on are forgotten (KV, log, penalty history); the sampler restarts after `draws` draws, with any new settings. */
  private async rewind(f: Frame): Promise<Frame> {
    const s = this.session(f.sessionId);
    const body = parseRewind(decodeJson(f.payload));
    const settings = body.sampler ?? s.settings;
    const sample = this.samplerFor(settings, body.draws); // bad settings refuse the rewind before it changes anything
    // the session's frames queued here predate it (a repair's chunks in flight): dropped, and the one
    // computing neither logs nor goes downstream — once this answers nothing stale leaves this stage
    s.epoch++;
    const rewound = new MeshError('SESSION_REWOUND', `session ${f.sessionId} was rewound to position ${f.position} on stage ${this.opts.stage} before this frame was computed`);
    this.inbox.drop(f.sessionId, f.position, rewound);
    if (body.ring !== undefined) s.ringGeneration = body.ring;
    await this.queue.cancel(f.sessionId, rewound);
    // a continued session (KV reuse) sends its prompt at once; held from now (as an open)
    await this.queue.holdWhile(f.sessionId, () => forgetFrom(f.sessionId, f.position, s, this.opts.backend, this.opts.spotCheck));
    s.pipelineError = null;
    s.tentative = Infinity;
    s.settings = settings;
    s.sample = sample;
    if (body.logprobs !== undefined) s.logprobs = body.logprobs;
    // the penalty history (cut at f.position above), then the tokens the client says come from `from` on
    const from = body.from ?? f.position;
    if (body.tokens && from <= s.history.length) s.history.splice(from, s.history.length - from, ...body.tokens);
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, position: f.position });
  }

  /** Resend: the logged hidden states of [f.position, body.end) go to the next stage again, as Replay frames, in order. */
  private async resend(f: Frame): Promise<Frame> {
    const s = this.session(f.sessionId);
    const body = parseResend(decodeJson(f.payload));
    const next = this.opts.downstream;
    if (!next) throw new MeshError('STAGE_UNREACHABLE', `stage ${this.opts.stage} has no next stage to resend to`, { stage: this.opts.stage + 1 });
    if (body.end > s.log.end) throw new MeshError('POSITION_MISMATCH', `stage ${this.opts.stage} logged hidden states up to ${s.log.end}, asked to resend up to ${body.end}`, { expected: s.log.end, got: body.end });
    const { frames, bytes } = await s.log.resend(f, f.position, body.end, body.maxTokens, next, (e) => this.downstreamError(e, next));
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, position: body.end, frames, bytes });
  }

  private async close(f: Frame): Promise<Frame> {
    if (!this.sessions.has(f.sessionId)) throw new MeshError('SESSION_UNKNOWN', `frame session id: session ${f.sessionId} is not open on stage ${this.opts.stage}`, { field: 'session id' });
    await this.release(f.sessionId, 'closed');
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, state: 'closed' });
  }

  /** Forgets a session: its queued chunks are dropped, the one computing finishes, then its KV is freed. */
  private async release(sessionId: string, why: string): Promise<void> {
    this.sessions.delete(sessionId);
    const closed = new MeshError('SESSION_CLOSED', `session ${sessionId} was ${why} on stage ${this.opts.stage}`);
    this.inbox.drop(sessionId, 0, closed);
    await this.queue.cancel(sessionId, closed);
    await this.opts.spotCheck?.close(sessionId);
    await this.opts.backend.releaseSession(sessionId);
  }

  private async expireIdle(): Promise<void> {
    const now = performance.now();
    for (const [id, s] of [...this.sessions]) {
      if (now - s.lastUsed >= this.limits.idleTtlMs) await this.release(id, 'expired (idle)').catch(() => undefined);
    }
  }

  private session(id: string): StageSession {
    const s = this.sessions.get(id);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `frame session id: session ${id} is not open on stage ${this.opts.stage}`, { field: 'session id' });
    return s;
  }

  private async compute(f: Frame, input: Input, carried: StepTiming[] = []): Promise<Frame> {
    const s = this.session(f.sessionId);
    const started = performance.now();
    s.lastUsed = started;
    const timing = s.timing;
    timing.steps++;
    const bytesIn = f.type === FrameType.Hidden ? HEADER_BYTES + f.payload.byteLength : 0;
    timing.bytesIn += bytesIn;
    const arrived = f.receivedAt ?? started;
    const step: StepCost = {
      computeMs: 0,
      downstreamMs: 0,
      bytesOut: 0,
      queueMs: 0,
      records: () => [
        ...carried,
        {
          stage: this.opts.stage,
          position: f.position,
          computeUs: step.computeMs * 1000,
          downstreamUs: step.downstreamMs * 1000,
          handleUs: (performance.now() - arrived) * 1000,
          queueUs: (started - arrived + step.queueMs) * 1000,
          bytesIn,
          bytesOut: step.bytesOut,
        },
      ],
    };
    let reply: Frame;
    try {
      if (f.flags & FrameFlag.Verify) await dropRejected(f, s, this.opts.backend, this.opts.spotCheck);
      if (verifies(f) && this.isLast) reply = this.answer(f, await verifyAnswer(f, input, (row, rowInput) => this.computeStep(row, s, rowInput, step)), step);
      else reply = f.nTokens > this.limits.chunkTokens ? await this.computeChunks(f, s, input, step) : await this.computeStep(f, s, input, step);
    } finally {
      timing.handleMs += performance.now() - started;
    }
    // on the one-way path the records went forward with the hidden states, not back
    if (!(f.flags & FrameFlag.WantTimings) || f.flags & FrameFlag.ReturnDirect) return reply;
    // this stage's part of the step joins the trailer on its way back up the chain
    return withTimings(reply, step.records().slice(carried.length));
  }

  /** A downstream failure as this stage reports it: the failing stage named. */
  private downstreamError(e: unknown, next: FrameLink): MeshError {
    if (e instanceof MeshError && e.details?.stage !== undefined) return e;
    const code = e instanceof MeshError && (e.code === 'LINK_CLOSED' || e.code === 'LINK_FAILED') ? 'STAGE_UNREACHABLE' : e instanceof MeshError ? e.code : 'STAGE_FAILED';
    return new MeshError(code, `stage ${this.opts.stage + 1} (${next.remote}): ${(e as Error).message}`, { stage: this.opts.stage + 1 });
  }

  /**
   * A frame of more than `chunkTokens` tokens, computed chunk by chunk: each chunk waits its turn
   * in the compute queue (so other sessions' decode steps run between them) and goes on to the
   * next stage as soon as it is done; only the last one carries the frame's Sample, WantLogits
   * and ReturnDirect (its answer, the token or the one-way Status, is the frame's).
   */
  private async computeChunks(f: Frame, s: StageSession, input: Input, step: StepCost): Promise<Frame> {
    const chunk = this.limits.chunkTokens;
    let reply: Frame | null = null;
    for (let at = 0; at < f.nTokens; at += chunk) {
      const n = Math.min(chunk, f.nTokens - at);
      reply = await this.computeStep(frameChunk(f, at, n), s, inputSlice(input, f.nTokens, at, n), step);
    }
    return reply!;
  }

  private async computeStep(f: Frame, s: StageSession, input: Input, step: StepCost): Promise<Frame> {
    if (s.pipelineError) throw s.pipelineError;
    if (!this.sessions.has(f.sessionId)) throw new MeshError('SESSION_CLOSED', `session ${f.sessionId} was closed on stage ${this.opts.stage}`);
    const epoch = s.epoch;
    const turn = await stageForward(this.queue, this.opts.backend, f, input, s.hiddenDtype === DType.F32 ? 'f32' : 'f16');
    if (s.epoch !== epoch) throw new MeshError('SESSION_REWOUND', `session ${f.sessionId} was rewound on stage ${this.opts.stage} while position ${f.position} was computing`);
    const { output, computeMs } = turn.value;
    step.queueMs += turn.waitedMs;
    // after the forward: a refused frame leaves no trace
    if (f.type === FrameType.Hidden) s.log.received(f.position, rowHashes(f.payload, f.nTokens));
    s.timing.computeMs += computeMs;
    step.computeMs += computeMs;
    const replay = (f.flags & FrameFlag.Replay) !== 0;
    const sampleNow = !replay && (f.type === FrameType.Decode || (f.flags & FrameFlag.Sample) !== 0);
    if (output.kind !== 'logits') {
      const flags = (f.flags & (FrameFlag.Sample | FrameFlag.WantLogits | FrameFlag.WantTimings | FrameFlag.ReturnDirect | FrameFlag.Verify | FrameFlag.Ring)) | (sampleNow ? FrameFlag.Sample : 0);
      const at = { routeId: f.routeId, sessionId: f.sessionId };
      const out =
        output.kind === 'rows'
          ? hiddenRowsFrame(at, f.position, output.bytes, output.nTokens, output.width, output.dtype === 'f32' ? DType.F32 : DType.F16, flags)
          : hiddenFrame(at, f.position, output.hidden, output.nTokens, s.hiddenDtype, flags);
      s.log.append({ position: f.position, nTokens: out.nTokens, dtype: out.dtype as DType.F16 | DType.F32, width: out.width, payload: out.payload });
      if (!replay) this.opts.spotCheck?.expected(this.queue, out, () => decodeRows(out.payload, out.dtype));
      // a replay fills this stage's KV cache and log; the stage after already holds these positions
      if (replay) return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: f.position + f.nTokens, replayed: true });
      const next = this.opts.downstream;
      if (!next) throw new MeshError('STAGE_UNREACHABLE', `stage ${this.opts.stage} has no next stage to send hidden states to`, { stage: this.opts.stage + 1 });
      this.bytesOut += out.payload.byteLength;
      this.wireBytesOut += HEADER_BYTES + out.payload.byteLength;
      this.framesOut++;
      s.timing.bytesOut += HEADER_BYTES + out.payload.byteLength;
      step.bytesOut += HEADER_BYTES + out.payload.byteLength;
      const sent = performance.now();
      if (!sampleNow && !(f.flags & FrameFlag.WantLogits) && next.ordered === true) {
        // a prefill chunk nobody waits on: pass it on and answer at once, so this stage
        // computes the next chunk while the next stage computes this one (frames on an ordered
        // link stay in order; a failure surfaces on this session's next frame)
        void next.request(out).then(
          () => undefined,
          (e) => void (s.epoch === epoch && (s.pipelineError ??= this.downstreamError(e, next))), // (not a failure of a rewound session's)
        );
        return jsonFrame(FrameType.Status, { routeId: f.routeId, sessionId: f.sessionId }, { stage: this.opts.stage, position: f.position + f.nTokens, pipelined: true });
      }
      // one-way: this stage's timing (and the ones before) ride forward to the last stage
      const sending = flags & FrameFlag.ReturnDirect && flags & FrameFlag.WantTimings ? withTimings(out, step.records()) : out;
      const owner = this.opts.returnTo;
      if (flags & FrameFlag.ReturnDirect && owner) {
        // one-way: answer at once, so the next step's frame on our connection need not wait for
        // the answers climbing back; a failure downstream goes to the owner one-way too
        const end = f.position + f.nTokens;
        void next.request(sending).then(
          () => undefined,
          (e) => void (s.epoch === epoch && owner({ ...errorReplyFor(f, (s.pipelineError ??= this.downstreamError(e, next))), position: end })),
        );
        return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: end, forwarded: true });
      }
      try {
        return await next.request(sending);
      } catch (e) {
        // an earlier pipelined chunk's failure explains this one best
        throw s.pipelineError ?? this.downstreamError(e, next);
      } finally {
        const ms = performance.now() - sent;
        step.downstreamMs += ms;
        s.timing.downstreamMs += ms;
      }
    }
    const nextPosition = f.position + f.nTokens;
    const at = { routeId: f.routeId, sessionId: f.sessionId };
    if (f.flags & FrameFlag.WantLogits && !replay) return logitsFrame(at, nextPosition, output.logits);
    if (!sampleNow) return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: nextPosition, ...(replay ? { replayed: true } : {}) });
    const sampled = s.sample!(output.logits, s.history.length > nextPosition ? s.history.slice(0, nextPosition) : s.history);
    // the token sampled here occupies position nextPosition: it joins the history when the history reaches that far
    if (s.history.length === nextPosition) s.history.push(sampled);
    // the ring: stage 0 holds the next step already, waiting for this token (sent before the owner's: it is on the critical path)
    if (f.flags & FrameFlag.Ring && f.flags & FrameFlag.ReturnDirect && this.opts.ring) {
      // a token that never gets there leaves the step sent ahead for it waiting: that step fails, one-way
      const broken = (e: unknown): void => this.opts.returnTo?.({ ...errorReplyFor(f, new MeshError('RING_BROKEN', `stage ${this.opts.stage}: the ring token for position ${nextPosition} did not reach stage 0: ${(e as Error).message}`, { stage: this.opts.stage })), position: nextPosition + 1 });
      this.opts.ring(ringTokenFrame(at, nextPosition, sampled, s.ringGeneration)).catch(broken);
      this.tokensRinged++;
    }
    return this.answer(f, sampledFrame(at, nextPosition, sampled, s.logprobs === null ? null : tokenLogprob(output.logits, sampled, s.logprobs)), step);
  }

  /** The last stage's Token for step `f`: the reply, or — one-way (ReturnDirect) — sent to the session's owner, and a Status the reply. */
  private answer(f: Frame, token: Frame, step: StepCost): Frame {
    if (!(f.flags & FrameFlag.ReturnDirect)) return token;
    const timed = f.flags & FrameFlag.WantTimings ? withTimings(token, step.records()) : token;
    if (!this.opts.returnTo) return timed; // no way to the owner here: the token climbs back
    this.opts.returnTo(timed);
    this.tokensReturned++;
    return jsonFrame(FrameType.Status, { routeId: f.routeId, sessionId: f.sessionId }, { stage: this.opts.stage, position: token.position, returned: true });
  }

  /** A session's counters on this stage; a session that is not open holds nothing. */
  sessionStatus(sessionId: string, query: StatusQuery = {}): Record<string, unknown> {
    const s = this.sessions.get(sessionId);
    if (!s) return { stage: this.opts.stage, shard: this.opts.shard, open: false, position: 0, kvBytes: 0, processedTokens: [] };
    const counters = sessionCounters(this.opts.stage, s.timing, s.log, query);
    return { stage: this.opts.stage, shard: this.opts.shard, open: true, backend: this.opts.backend.kind, ...this.opts.backend.sessionStats(sessionId), replayLogBytes: s.log.bytes, ...counters };
  }

  status(): StageStatus {
    return {
      stage: this.opts.stage,
      shard: this.opts.shard,
      backend: this.opts.backend.kind,
      sessions: [...this.sessions.keys()].map((id) => ({ sessionId: id, ...this.opts.backend.sessionStats(id) })),
      batching: { ...this.queue.batching },
    };
  }

  /** Frees every session (the stage is leaving the route). */
  async releaseAll(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = null;
    for (const id of [...this.sessions.keys()]) await this.release(id, 'released').catch(() => undefined);
    await this.opts.spotCheck?.releaseAll();
  }

  get openSessions(): number {
    return this.sessions.size;
  }
}
