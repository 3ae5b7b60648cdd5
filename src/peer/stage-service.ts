// One stage of a route, as a frame handler: it runs its backend over incoming tokens (stage 0)
// or hidden states (later stages), passes hidden states straight to the next stage, and — on
// the last stage — samples the next token (or returns logits when asked). The reply travels
// back up the chain — or, on the one-way token path (FrameFlag.ReturnDirect), the last stage
// hands the token straight to the session's owner (`returnTo`) and the stages answer each
// other with a Status off the token's critical path: N + 1 hops per token instead of 2N.
//
// Session open/close/status frames act on this stage only: the session's owner sends them to
// every stage itself, so a lost stage can never keep another stage's KV cache alive.
//
// For repair (route/repair.ts) a stage keeps, per session, the hidden states it sent downstream
// and a hash of every row it received (replay-log.ts), and answers three more requests: Rewind
// (forget positions from p on, reset the sampler), Resend (send logged hidden states to the
// next stage again as Replay frames) and Replay-flagged input (compute and log, send nothing on).

import { MeshError } from '../errors.ts';
import type { HiddenRows, StageBackend, StageInput, ShardRange } from '../backends/types.ts';
import { argmax, tokenLogprob } from '../model/sampler.ts';
import { DType, FrameFlag, FrameType, HEADER_BYTES, makeFrame, MAX_TOP_LOGPROBS } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, decodeJson, decodeRows, hiddenFrame, hiddenRowsFrame, jsonFrame, logitsFrame, payloadBody, replyAddress, sampledFrame, timingsOf, withTimings } from '../protocol/payload.ts';
import type { StepTiming } from '../protocol/payload.ts';
import { errorReplyFor } from '../transport/link.ts';
import type { FrameLink } from '../transport/link.ts';
import type { StageTiming } from '../route/telemetry.ts';
import type { ResendBody, RewindBody, SamplerSettings, SessionOpenBody } from '../protocol/session.ts';
import { ReplayLog, rowHashes } from './replay-log.ts';

/** Picks a token from the logits; history: the session's tokens at positions [0, p) (for penalties). */
export type TokenSampler = (logits: Float32Array, history: readonly number[]) => number;
/** A sampler for a session's settings that has already made `draws` random draws. */
export type SamplerFactory = (settings: SamplerSettings, draws: number) => TokenSampler;


/** What a Status request for one session may ask besides the counters: row hashes of what the stage sent or received, for positions [a, b). */
export interface StatusQuery {
  sentHashes?: [number, number];
  receivedHashes?: [number, number];
}

export interface StageStatus {
  stage: number;
  shard: ShardRange;
  backend: string;
  sessions: Array<{ sessionId: string; position: number; kvBytes: number; processedTokens: number[] }>;
}

export interface StageServiceOptions {
  backend: StageBackend;
  stage: number;
  shard: ShardRange;
  nLayer: number;
  /** the next stage, or null on the last stage */
  downstream: FrameLink | null;
  samplerFactory?: SamplerFactory;
  /**
   * the one-way way to the session's owner: on the last stage a ReturnDirect step's Token goes
   * here instead of into the reply; on the others, with it the stage answers a ReturnDirect step
   * as soon as it forwarded it and sends a failure downstream here as an Error (position = the
   * step's end). Absent: the token and the answers climb back as replies, as before.
   */
  returnTo?: ((token: Frame) => void) | undefined;
}

/** One step's measures on this stage, and the timing records it carries forward (ReturnDirect). */
interface StepContext {
  computeMs: number;
  downstreamMs: number;
  bytesOut: number;
  /** the records of the stages before (from the incoming Hidden frame's trailer) and this one's, as of now */
  records(): StepTiming[];
}

interface StageSession {
  sample: TokenSampler | null;
  settings: SamplerSettings;
  /** the session's token ids by position, as far as this stage knows them (the client's `tokens`, then what it sampled): the penalties' history */
  history: number[];
  /** top alternatives to report with each sampled token's log-probability; null: none */
  logprobs: number | null;
  /** hidden states sent downstream, and hashes of rows received (for repairs) */
  log: ReplayLog;
  hiddenDtype: DType.F16 | DType.F32;
  /** totals over the session's steps, for telemetry */
  timing: { steps: number; computeMs: number; downstreamMs: number; handleMs: number; bytesIn: number; bytesOut: number };
  /** the first failure of a pipelined prefill chunk downstream, reported on the next frame */
  pipelineError: MeshError | null;
}

export class StageService {
  private sessions = new Map<string, StageSession>();
  /** payload bytes of hidden states sent downstream and received from upstream */
  bytesOut = 0;
  bytesIn = 0;
  /** whole frames (header + payload) sent downstream, and how many */
  wireBytesOut = 0;
  framesOut = 0;
  /** tokens this (last) stage sent one-way to the session's owner (ReturnDirect) */
  tokensReturned = 0;

  constructor(private readonly opts: StageServiceOptions) {}

  get isFirst(): boolean {
    return this.opts.shard.start === 0;
  }

  get isLast(): boolean {
    return this.opts.shard.end === this.opts.nLayer;
  }

  setDownstream(link: FrameLink | null): void {
    this.opts.downstream = link;
  }

  setReturnTo(send: ((token: Frame) => void) | undefined): void {
    this.opts.returnTo = send;
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
        return jsonFrame(FrameType.Status, replyAddress(f), f.sessionId === '0'.repeat(32) ? this.status() : this.sessionStatus(f.sessionId, f.dtype === DType.Json ? decodeJson<StatusQuery>(f.payload) : {}));
      case FrameType.Rewind:
        return this.rewind(f);
      case FrameType.Resend:
        return this.resend(f);
      case FrameType.Prefill:
      case FrameType.Decode:
        if (!this.isFirst) throw new MeshError('STAGE_INPUT_KIND', `stage ${this.opts.stage} takes hidden states, not token ids`);
        return this.compute(f, { kind: 'tokens', tokens: decodeI32(f.payload) });
      case FrameType.Hidden: {
        if (this.isFirst) throw new MeshError('STAGE_INPUT_KIND', 'stage 0 takes token ids, not hidden states');
        // on the one-way path the stages before send their timing records forward in a trailer
        const carried = timingsOf(f);
        const h: Frame = { ...f, flags: f.flags & ~FrameFlag.Timings, payload: payloadBody(f) };
        this.bytesIn += h.payload.byteLength;
        return this.compute(h, this.opts.backend.forwardRows ? hiddenRowsOf(h) : { kind: 'hidden', hidden: decodeRows(h.payload, h.dtype), nTokens: h.nTokens }, carried);
      }
      default:
        throw new MeshError('FRAME_BAD_TYPE', `frame type: a stage does not accept ${FrameType[f.type]} frames`, { field: 'type' });
    }
  }

  private async open(f: Frame): Promise<Frame> {
    const body = decodeJson<SessionOpenBody>(f.payload);
    if (!Number.isInteger(body.contextLength) || body.contextLength < 1) {
      throw new MeshError('BAD_REQUEST', `session open: contextLength must be a positive integer, got ${String(body.contextLength)}`);
    }
    if (this.sessions.has(f.sessionId)) throw new MeshError('SESSION_EXISTS', `session ${f.sessionId} is already open`);
    const draws = count(body.draws ?? 0, 'session open: draws');
    const settings = body.sampler ?? {};
    const sample = this.samplerFor(settings, draws); // bad settings are refused before the backend holds the session
    const history = tokenIds(body.tokens, 'session open: tokens') ?? [];
    await this.opts.backend.openSession(f.sessionId, { contextLength: body.contextLength });
    this.sessions.set(f.sessionId, {
      sample,
      settings,
      history,
      logprobs: logprobsSetting(body.logprobs),
      log: new ReplayLog(),
      hiddenDtype: body.hiddenDtype === 'f32' ? DType.F32 : DType.F16,
      timing: { steps: 0, computeMs: 0, downstreamMs: 0, handleMs: 0, bytesIn: 0, bytesOut: 0 },
      pipelineError: null,
    });
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, state: 'open', position: 0 });
  }

  /** the stage's sampler factory's sampler for the settings (greedy argmax on a stage without one); null off the last stage */
  private samplerFor(settings: SamplerSettings, draws: number): TokenSampler | null {
    if (!this.isLast) return null;
    return this.opts.samplerFactory ? this.opts.samplerFactory(settings, draws) : (logits) => argmax(logits);
  }

  /** Rewind: positions from f.position on are forgotten here (KV cache, log); the sampler restarts after `draws` draws. */
  private async rewind(f: Frame): Promise<Frame> {
    const s = this.session(f.sessionId);
    const body = decodeJson<Partial<RewindBody> | null>(f.payload);
    const draws = count(body?.draws ?? 0, 'rewind: draws');
    const settings = body?.sampler ?? s.settings;
    const sample = this.samplerFor(settings, draws); // bad settings refuse the rewind before it changes anything
    const tokens = tokenIds(body?.tokens, 'rewind: tokens');
    const from = count(body?.from ?? f.position, 'rewind: from');
    await this.opts.backend.truncateSession(f.sessionId, f.position);
    s.log.truncate(f.position);
    s.pipelineError = null;
    s.settings = settings;
    s.sample = sample;
    if (body?.logprobs !== undefined) s.logprobs = logprobsSetting(body.logprobs);
    // the penalty history: positions kept, then the tokens the client says come from `from` on
    if (s.history.length > f.position) s.history.length = f.position;
    if (tokens && from <= s.history.length) {
      s.history.length = from;
      s.history.push(...tokens);
    }
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, position: f.position });
  }

  /** Resend: the logged hidden states of [f.position, body.end) go to the next stage again, as Replay frames, in order. */
  private async resend(f: Frame): Promise<Frame> {
    const s = this.session(f.sessionId);
    const body = decodeJson<Partial<ResendBody> | null>(f.payload);
    const end = count(body?.end, 'resend: end');
    const maxTokens = Math.max(1, count(body?.maxTokens ?? 1, 'resend: maxTokens'));
    const next = this.opts.downstream;
    if (!next) throw new MeshError('STAGE_UNREACHABLE', `stage ${this.opts.stage} has no next stage to resend to`, { stage: this.opts.stage + 1 });
    if (end > s.log.end) throw new MeshError('POSITION_MISMATCH', `stage ${this.opts.stage} logged hidden states up to ${s.log.end}, asked to resend up to ${end}`, { expected: s.log.end, got: end });
    let frames = 0;
    let bytes = 0;
    for (const part of s.log.slice(f.position, end, maxTokens)) {
      const out = makeFrame({ type: FrameType.Hidden, routeId: f.routeId, sessionId: f.sessionId, flags: FrameFlag.Replay, position: part.position, nTokens: part.nTokens, dtype: part.dtype, width: part.width, payload: part.payload });
      try {
        await next.request(out);
      } catch (e) {
        throw this.downstreamError(e, next);
      }
      frames++;
      bytes += HEADER_BYTES + part.payload.byteLength;
    }
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, position: end, frames, bytes });
  }

  private async close(f: Frame): Promise<Frame> {
    if (!this.sessions.delete(f.sessionId)) throw new MeshError('SESSION_UNKNOWN', `frame session id: session ${f.sessionId} is not open on stage ${this.opts.stage}`, { field: 'session id' });
    await this.opts.backend.releaseSession(f.sessionId);
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, state: 'closed' });
  }

  private session(id: string): StageSession {
    const s = this.sessions.get(id);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `frame session id: session ${id} is not open on stage ${this.opts.stage}`, { field: 'session id' });
    return s;
  }

  private async compute(f: Frame, input: StageInput | HiddenRows, carried: StepTiming[] = []): Promise<Frame> {
    const s = this.session(f.sessionId);
    const started = performance.now();
    const timing = s.timing;
    timing.steps++;
    const bytesIn = f.type === FrameType.Hidden ? HEADER_BYTES + f.payload.byteLength : 0;
    timing.bytesIn += bytesIn;
    const arrived = f.receivedAt ?? started;
    const step: StepContext = {
      computeMs: 0,
      downstreamMs: 0,
      bytesOut: 0,
      records: () => [
        ...carried,
        {
          stage: this.opts.stage,
          position: f.position,
          computeUs: step.computeMs * 1000,
          downstreamUs: step.downstreamMs * 1000,
          handleUs: (performance.now() - arrived) * 1000,
          queueUs: (started - arrived) * 1000,
          bytesIn,
          bytesOut: step.bytesOut,
        },
      ],
    };
    let reply: Frame;
    try {
      reply = await this.computeStep(f, s, input, step);
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

  /** The backend's step: rows straight through where it takes them, decoded f32 otherwise. */
  private forward(f: Frame, s: StageSession, input: StageInput | HiddenRows): ReturnType<NonNullable<StageBackend['forwardRows']>> | ReturnType<StageBackend['forward']> {
    const backend = this.opts.backend;
    if (backend.forwardRows) return backend.forwardRows(f.sessionId, input, f.position, s.hiddenDtype === DType.F32 ? 'f32' : 'f16');
    if (input.kind === 'rows') throw new MeshError('BAD_STAGE_INPUT', 'internal: encoded rows for a backend that takes f32');
    return backend.forward(f.sessionId, input, f.position);
  }

  private async computeStep(f: Frame, s: StageSession, input: StageInput | HiddenRows, step: StepContext): Promise<Frame> {
    if (s.pipelineError) throw s.pipelineError;
    const { output, computeMs } = await this.forward(f, s, input);
    // after the forward: a refused frame leaves no trace
    if (f.type === FrameType.Hidden) s.log.received(f.position, rowHashes(f.payload, f.nTokens));
    s.timing.computeMs += computeMs;
    step.computeMs = computeMs;
    const replay = (f.flags & FrameFlag.Replay) !== 0;
    const sampleNow = !replay && (f.type === FrameType.Decode || (f.flags & FrameFlag.Sample) !== 0);
    if (output.kind !== 'logits') {
      const flags = (f.flags & (FrameFlag.Sample | FrameFlag.WantLogits | FrameFlag.WantTimings | FrameFlag.ReturnDirect)) | (sampleNow ? FrameFlag.Sample : 0);
      const at = { routeId: f.routeId, sessionId: f.sessionId };
      const out =
        output.kind === 'rows'
          ? hiddenRowsFrame(at, f.position, output.bytes, output.nTokens, output.width, output.dtype === 'f32' ? DType.F32 : DType.F16, flags)
          : hiddenFrame(at, f.position, output.hidden, output.nTokens, s.hiddenDtype, flags);
      s.log.append({ position: f.position, nTokens: out.nTokens, dtype: out.dtype as DType.F16 | DType.F32, width: out.width, payload: out.payload });
      // a replay fills this stage's KV cache and log; the stage after already holds these positions
      if (replay) return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: f.position + f.nTokens, replayed: true });
      const next = this.opts.downstream;
      if (!next) throw new MeshError('STAGE_UNREACHABLE', `stage ${this.opts.stage} has no next stage to send hidden states to`, { stage: this.opts.stage + 1 });
      this.bytesOut += out.payload.byteLength;
      this.wireBytesOut += HEADER_BYTES + out.payload.byteLength;
      this.framesOut++;
      s.timing.bytesOut += HEADER_BYTES + out.payload.byteLength;
      step.bytesOut = HEADER_BYTES + out.payload.byteLength;
      const sent = performance.now();
      if (!sampleNow && !(f.flags & FrameFlag.WantLogits)) {
        // a prefill chunk nobody waits on: pass it on and answer at once, so this stage
        // computes the next chunk while the next stage computes this one (frames on a link
        // stay in order; a failure surfaces on this session's next frame)
        void next.request(out).then(
          () => undefined,
          (e) => (s.pipelineError ??= this.downstreamError(e, next)),
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
          (e) => owner({ ...errorReplyFor(f, (s.pipelineError ??= this.downstreamError(e, next))), position: end }),
        );
        return jsonFrame(FrameType.Status, { routeId: f.routeId, sessionId: f.sessionId }, { stage: this.opts.stage, position: end, forwarded: true });
      }
      try {
        return await next.request(sending);
      } catch (e) {
        // an earlier pipelined chunk's failure explains this one best
        throw s.pipelineError ?? this.downstreamError(e, next);
      } finally {
        step.downstreamMs = performance.now() - sent;
        s.timing.downstreamMs += step.downstreamMs;
      }
    }
    const nextPosition = f.position + f.nTokens;
    const at = { routeId: f.routeId, sessionId: f.sessionId };
    if (f.flags & FrameFlag.WantLogits && !replay) return logitsFrame(at, nextPosition, output.logits);
    if (!sampleNow) return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: nextPosition, ...(replay ? { replayed: true } : {}) });
    const sampled = s.sample!(output.logits, s.history.length > nextPosition ? s.history.slice(0, nextPosition) : s.history);
    // the token sampled here occupies position nextPosition: it joins the history when the history reaches that far
    if (s.history.length === nextPosition) s.history.push(sampled);
    const token = sampledFrame(at, nextPosition, sampled, s.logprobs === null ? null : tokenLogprob(output.logits, sampled, s.logprobs));
    if (!(f.flags & FrameFlag.ReturnDirect)) return token;
    const timed = f.flags & FrameFlag.WantTimings ? withTimings(token, step.records()) : token;
    if (!this.opts.returnTo) return timed; // no way to the owner here: the token climbs back
    this.opts.returnTo(timed);
    this.tokensReturned++;
    return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: nextPosition, returned: true });
  }

  /** A session's counters on this stage; a session that is not open holds nothing. */
  sessionStatus(sessionId: string, query: StatusQuery = {}): Record<string, unknown> {
    if (!this.sessions.has(sessionId)) return { stage: this.opts.stage, shard: this.opts.shard, open: false, position: 0, kvBytes: 0, processedTokens: [] };
    const t = this.sessions.get(sessionId)!.timing;
    const round = (x: number): number => Math.round(x * 1000) / 1000;
    const timing: StageTiming = {
      stage: this.opts.stage,
      steps: t.steps,
      computeMs: round(t.computeMs),
      downstreamMs: round(t.downstreamMs),
      overheadMs: round(Math.max(0, t.handleMs - t.computeMs - t.downstreamMs)),
      bytesIn: t.bytesIn,
      bytesOut: t.bytesOut,
    };
    const log = this.sessions.get(sessionId)!.log;
    const sent = query.sentHashes === undefined ? null : span(query.sentHashes, 'sentHashes');
    const received = query.receivedHashes === undefined ? null : span(query.receivedHashes, 'receivedHashes');
    const hashes = {
      ...(sent ? { sentHashes: log.sentHashes(sent[0], sent[1]) } : {}),
      ...(received ? { receivedHashes: log.receivedHashes(received[0], received[1]) } : {}),
    };
    return { stage: this.opts.stage, shard: this.opts.shard, open: true, backend: this.opts.backend.kind, ...this.opts.backend.sessionStats(sessionId), replayLogBytes: log.bytes, timing, ...hashes };
  }

  status(): StageStatus {
    return {
      stage: this.opts.stage,
      shard: this.opts.shard,
      backend: this.opts.backend.kind,
      sessions: [...this.sessions.keys()].map((id) => ({ sessionId: id, ...this.opts.backend.sessionStats(id) })),
    };
  }

  /** Frees every session (the stage is leaving the route). */
  async releaseAll(): Promise<void> {
    for (const id of [...this.sessions.keys()]) {
      this.sessions.delete(id);
      await this.opts.backend.releaseSession(id).catch(() => undefined);
    }
  }

  get openSessions(): number {
    return this.sessions.size;
  }
}

/** A non-negative integer from a request's JSON body, else BAD_REQUEST naming the field. */
function count(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new MeshError('BAD_REQUEST', `${what} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return v;
}

/** Token ids from a JSON body (absent: undefined), else BAD_REQUEST naming the field. */
function tokenIds(v: unknown, what: string): number[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((t) => Number.isInteger(t) && t >= 0)) throw new MeshError('BAD_REQUEST', `${what} must be a list of token ids, got ${JSON.stringify(v).slice(0, 80)}`);
  return v as number[];
}

/** Positions [a, b) of a Status hash query. */
function span(v: unknown, what: string): [number, number] {
  if (!Array.isArray(v) || v.length !== 2) throw new MeshError('BAD_REQUEST', `status query: ${what} must be [start, end], got ${JSON.stringify(v)}`);
  return [count(v[0], `status query: ${what}[0]`), count(v[1], `status query: ${what}[1]`)];
}

/** A session's logprobs setting: top alternatives to report (0–20), or null for none. */
function logprobsSetting(v: number | null | undefined): number | null {
  return v === undefined || v === null ? null : Math.max(0, Math.min(MAX_TOP_LOGPROBS, Math.floor(Number(v)) || 0));
}

/** A Hidden frame's payload as rows for a backend's forwardRows (no decoding here). */
function hiddenRowsOf(f: Frame): HiddenRows {
  if (f.dtype !== DType.F16 && f.dtype !== DType.F32) {
    throw new MeshError('FRAME_BAD_DTYPE', `frame dtype: hidden states must be F16 or F32, got ${DType[f.dtype] ?? f.dtype}`, { field: 'dtype' });
  }
  return { kind: 'rows', dtype: f.dtype === DType.F32 ? 'f32' : 'f16', bytes: f.payload, nTokens: f.nTokens, width: f.width };
}
