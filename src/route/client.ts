// The client's view of one session on a route: open, prefill the prompt in chunks, decode one
// token at a time, close. It speaks frames over any FrameLink (to the signaling server, or to
// an in-process SessionManager) and keeps the position so every frame names where it goes.
// Over a joinRoom link (remote.ts) its session outlives the server instance it goes through:
// the link opens it again elsewhere and replays it (resuming-link.ts), under the same ids here.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType, makeFrame } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeJson, decodeRows, decodeSampled, jsonFrame, payloadBody, repairFrame, timingsOf, tokensFrame } from '../protocol/payload.ts';
import type { SampledLogprob, StepTiming } from '../protocol/payload.ts';
import type { FrameLink } from '../transport/link.ts';
import { newSessionId } from '../protocol/session.ts';
import type { SessionInfo } from './sessions.ts';
import type { RewindBody, SessionOpenBody } from '../protocol/session.ts';

/**
 * Prompt tokens per prefill frame. CPU stages run a chunk on every core and WebGPU stages want
 * big batches, so a chunk buys more as matmul work than as pipelining between stages; measured
 * on the 3-stage route bench (6 × 512, 128-token prompt): 16 / 32 / 64 / 128 tokens per chunk
 * prefill at 1198 / 1469 / 1621 / 1787 tok/s in one process, 1077 / 1314 / 1552 / 1616 as
 * processes.
 */
export const DEFAULT_PREFILL_CHUNK = 128;
/** Most tokens one frame carries: what the session manager and the stages take by default. */
export const MAX_FRAME_TOKENS = 512;

export class RouteSessionClient {
  position = 0;
  /** ask every stage for its step timing (a trailer on Token/Logits replies) */
  wantTimings = false;
  /** per-stage timings of the last step, in stage order (when wantTimings) */
  lastTimings: StepTiming[] = [];
  /** the last sampled token's log-probabilities (sessions opened with `logprobs`) */
  lastLogprob: SampledLogprob | null = null;
  private closed = false;

  private constructor(
    private readonly link: FrameLink,
    readonly routeId: number,
    readonly sessionId: string,
  ) {}

  static async open(link: FrameLink, routeId: number, body: SessionOpenBody, sessionId = newSessionId()): Promise<RouteSessionClient> {
    await link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId }, body));
    return new RouteSessionClient(link, routeId, sessionId);
  }

  /** The client of a session already open on the route (kept from an earlier generation), at `position`. */
  static attach(link: FrameLink, routeId: number, sessionId: string, position: number): RouteSessionClient {
    const c = new RouteSessionClient(link, routeId, sessionId);
    c.position = position;
    return c;
  }

  /** Continues the session from `position` (≤ the current one): every stage forgets the rest and takes `body`'s sampler settings. */
  async rewind(position: number, body: RewindBody): Promise<void> {
    await this.link.request(repairFrame(FrameType.Rewind, this.at(), position, body));
    this.position = position;
  }

  private at(): { routeId: number; sessionId: string } {
    return { routeId: this.routeId, sessionId: this.sessionId };
  }

  /** Sends the prompt in chunks; the last chunk is sampled. Returns the first generated token. */
  async prefill(tokens: ArrayLike<number>, chunk = DEFAULT_PREFILL_CHUNK, onChunk?: (done: number, total: number) => void): Promise<number> {
    if (tokens.length === 0) throw new MeshError('BAD_REQUEST', 'prefill needs at least one token');
    chunk = Math.min(chunk, MAX_FRAME_TOKENS);
    let reply: Frame | null = null;
    for (let i = 0; i < tokens.length; i += chunk) {
      const part = Array.from({ length: Math.min(chunk, tokens.length - i) }, (_, k) => tokens[i + k]!);
      const last = i + part.length >= tokens.length;
      reply = await this.link.request(tokensFrame(FrameType.Prefill, this.at(), this.position, part, (last ? FrameFlag.Sample : 0) | this.timingFlag()));
      this.position += part.length;
      onChunk?.(i + part.length, tokens.length);
    }
    return this.tokenOf(reply!);
  }

  /** Sends the prompt in chunks like prefill, but the last chunk asks for its logits [n_vocab] instead of a token (sampling on the client's side). */
  async prefillLogits(tokens: ArrayLike<number>, chunk = DEFAULT_PREFILL_CHUNK, onChunk?: (done: number, total: number) => void): Promise<Float32Array> {
    if (tokens.length === 0) throw new MeshError('BAD_REQUEST', 'prefill needs at least one token');
    const all = Array.from(tokens);
    const lastAt = Math.floor((all.length - 1) / chunk) * chunk;
    for (let i = 0; i < lastAt; i += chunk) {
      const part = all.slice(i, i + chunk);
      await this.link.request(tokensFrame(FrameType.Prefill, this.at(), this.position, part, this.timingFlag()));
      this.position += part.length;
      onChunk?.(i + part.length, all.length);
    }
    const out = await this.logits(all.slice(lastAt));
    onChunk?.(all.length, all.length);
    return out;
  }

  /** Feeds the last sampled token and returns the next one. */
  async decode(token: number): Promise<number> {
    const reply = await this.link.request(tokensFrame(FrameType.Decode, this.at(), this.position, [token], FrameFlag.Sample | this.timingFlag()));
    this.position += 1;
    return this.tokenOf(reply);
  }

  /** Runs tokens through the route and returns the last position's logits [n_vocab]; a long run goes in frames of at most MAX_FRAME_TOKENS. */
  async logits(tokens: ArrayLike<number>): Promise<Float32Array> {
    const all = Array.from(tokens);
    while (all.length > MAX_FRAME_TOKENS) {
      const part = all.splice(0, MAX_FRAME_TOKENS);
      await this.link.request(tokensFrame(FrameType.Prefill, this.at(), this.position, part));
      this.position += part.length;
    }
    tokens = all;
    const type = tokens.length === 1 && this.position > 0 ? FrameType.Decode : FrameType.Prefill;
    // (a Decode answers with logits too when WantLogits is set)
    const reply = await this.link.request(tokensFrame(type, this.at(), this.position, tokens, FrameFlag.WantLogits | this.timingFlag()));
    this.position += tokens.length;
    if (reply.type !== FrameType.Logits) throw new MeshError('FRAME_BAD_TYPE', `expected Logits, got ${FrameType[reply.type]}`);
    this.lastTimings = timingsOf(reply).sort((a, b) => a.stage - b.stage);
    return decodeRows(payloadBody(reply), reply.dtype);
  }

  async info(): Promise<SessionInfo> {
    const r = await this.link.request(makeFrame({ type: FrameType.Status, ...this.at() }));
    return decodeJson<SessionInfo>(r.payload);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.link.request(makeFrame({ type: FrameType.SessionClose, ...this.at() }));
  }

  private timingFlag(): number {
    return this.wantTimings ? FrameFlag.WantTimings : 0;
  }

  private tokenOf(reply: Frame): number {
    if (reply.type !== FrameType.Token) throw new MeshError('FRAME_BAD_TYPE', `expected a Token frame, got ${FrameType[reply.type]}`);
    this.lastTimings = timingsOf(reply).sort((a, b) => a.stage - b.stage);
    const { token, logprob } = decodeSampled(reply);
    this.lastLogprob = logprob;
    return token;
  }
}

/** What every stepper over a RouteSessionClient shows of its session (route-generation.ts, constrained-stepper.ts); every step asks the stages for their timings. */
export abstract class ClientStepper {
  constructor(
    readonly client: RouteSessionClient,
    readonly contextLength: number,
  ) {
    client.wantTimings = true;
  }

  get sessionId(): string {
    return this.client.sessionId;
  }

  get position(): number {
    return this.client.position;
  }

  get lastTimings(): readonly StepTiming[] {
    return this.client.lastTimings;
  }
}
