// One stage of a route, as a frame handler: it runs its backend over incoming tokens (stage 0)
// or hidden states (later stages), passes hidden states straight to the next stage, and — on
// the last stage — samples the next token (or returns logits when asked). The reply travels
// back up the chain, so stage 0 sees every sampled token before the client does.
//
// Session open/close/status frames act on this stage only: the session's owner sends them to
// every stage itself, so a lost stage can never keep another stage's KV cache alive.

import { MeshError } from '../errors.ts';
import type { StageBackend, ShardRange } from '../backends/types.ts';
import { argmax } from '../model/sampler.ts';
import { DType, FrameFlag, FrameType, HEADER_BYTES } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeI32, decodeJson, decodeRows, hiddenFrame, jsonFrame, logitsFrame, replyAddress, tokensFrame, withTimings } from '../protocol/payload.ts';
import type { FrameLink } from '../transport/link.ts';
import type { StageTiming } from '../route/telemetry.ts';
import { parseSessionOpen } from '../protocol/session.ts';
import type { SamplerSettings } from '../protocol/session.ts';

export type TokenSampler = (logits: Float32Array) => number;
export type SamplerFactory = (settings: SamplerSettings) => TokenSampler;


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
}

interface StageSession {
  sample: TokenSampler | null;
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
        return jsonFrame(FrameType.Status, replyAddress(f), f.sessionId === '0'.repeat(32) ? this.status() : this.sessionStatus(f.sessionId));
      case FrameType.Prefill:
      case FrameType.Decode:
        if (!this.isFirst) throw new MeshError('STAGE_INPUT_KIND', `stage ${this.opts.stage} takes hidden states, not token ids`);
        return this.compute(f, { kind: 'tokens', tokens: decodeI32(f.payload) });
      case FrameType.Hidden:
        if (this.isFirst) throw new MeshError('STAGE_INPUT_KIND', 'stage 0 takes token ids, not hidden states');
        this.bytesIn += f.payload.byteLength;
        return this.compute(f, { kind: 'hidden', hidden: decodeRows(f.payload, f.dtype), nTokens: f.nTokens });
      default:
        throw new MeshError('FRAME_BAD_TYPE', `frame type: a stage does not accept ${FrameType[f.type]} frames`, { field: 'type' });
    }
  }

  private async open(f: Frame): Promise<Frame> {
    const body = parseSessionOpen(decodeJson(f.payload));
    if (this.sessions.has(f.sessionId)) throw new MeshError('SESSION_EXISTS', `session ${f.sessionId} is already open`);
    await this.opts.backend.openSession(f.sessionId, { contextLength: body.contextLength });
    const settings = body.sampler ?? {};
    const greedy = !settings.temperature;
    this.sessions.set(f.sessionId, {
      // greedy (argmax) unless the stage has a sampler factory and the session a temperature
      sample: this.isLast ? (greedy || !this.opts.samplerFactory ? argmax : this.opts.samplerFactory(settings)) : null,
      hiddenDtype: body.hiddenDtype === 'f32' ? DType.F32 : DType.F16,
      timing: { steps: 0, computeMs: 0, downstreamMs: 0, handleMs: 0, bytesIn: 0, bytesOut: 0 },
      pipelineError: null,
    });
    return jsonFrame(FrameType.Status, replyAddress(f), { stage: this.opts.stage, state: 'open', position: 0 });
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

  private async compute(f: Frame, input: Parameters<StageBackend['forward']>[1]): Promise<Frame> {
    const s = this.session(f.sessionId);
    const started = performance.now();
    const timing = s.timing;
    timing.steps++;
    const bytesIn = f.type === FrameType.Hidden ? HEADER_BYTES + f.payload.byteLength : 0;
    timing.bytesIn += bytesIn;
    const step = { computeMs: 0, downstreamMs: 0, bytesOut: 0 };
    let reply: Frame;
    try {
      reply = await this.computeStep(f, s, input, step);
    } finally {
      timing.handleMs += performance.now() - started;
    }
    if (!(f.flags & FrameFlag.WantTimings)) return reply;
    // this stage's part of the step joins the trailer on its way back up the chain
    const arrived = f.receivedAt ?? started;
    return withTimings(reply, [
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
    ]);
  }

  /** A downstream failure as this stage reports it: the failing stage named. */
  private downstreamError(e: unknown, next: FrameLink): MeshError {
    if (e instanceof MeshError && e.details?.stage !== undefined) return e;
    const code = e instanceof MeshError && (e.code === 'LINK_CLOSED' || e.code === 'LINK_FAILED') ? 'STAGE_UNREACHABLE' : e instanceof MeshError ? e.code : 'STAGE_FAILED';
    return new MeshError(code, `stage ${this.opts.stage + 1} (${next.remote}): ${(e as Error).message}`, { stage: this.opts.stage + 1 });
  }

  private async computeStep(f: Frame, s: StageSession, input: Parameters<StageBackend['forward']>[1], step: { computeMs: number; downstreamMs: number; bytesOut: number }): Promise<Frame> {
    if (s.pipelineError) throw s.pipelineError;
    const { output, computeMs } = await this.opts.backend.forward(f.sessionId, input, f.position);
    s.timing.computeMs += computeMs;
    step.computeMs = computeMs;
    const sampleNow = f.type === FrameType.Decode || (f.flags & FrameFlag.Sample) !== 0;
    if (output.kind === 'hidden') {
      const next = this.opts.downstream;
      if (!next) throw new MeshError('STAGE_UNREACHABLE', `stage ${this.opts.stage} has no next stage to send hidden states to`, { stage: this.opts.stage + 1 });
      const flags = (f.flags & (FrameFlag.Sample | FrameFlag.WantLogits | FrameFlag.WantTimings)) | (sampleNow ? FrameFlag.Sample : 0);
      const out = hiddenFrame({ routeId: f.routeId, sessionId: f.sessionId }, f.position, output.hidden, output.nTokens, s.hiddenDtype, flags);
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
      try {
        return await next.request(out);
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
    if (f.flags & FrameFlag.WantLogits) return logitsFrame(at, nextPosition, output.logits);
    if (!sampleNow) return jsonFrame(FrameType.Status, at, { stage: this.opts.stage, position: nextPosition });
    const token = s.sample!(output.logits);
    return tokensFrame(FrameType.Token, at, nextPosition, [token]);
  }

  /** A session's counters on this stage; a session that is not open holds nothing. */
  sessionStatus(sessionId: string): Record<string, unknown> {
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
    return { stage: this.opts.stage, shard: this.opts.shard, open: true, backend: this.opts.backend.kind, ...this.opts.backend.sessionStats(sessionId), timing };
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
