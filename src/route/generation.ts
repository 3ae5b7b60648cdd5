// Generation over a chain of stages, sampled here: the chain is anything that turns token ids
// into last-position logits (in-process stages here, a remote route over the network in
// remote.ts), and ChainStepper puts our Sampler beside it, so the one generation loop
// (generation-loop.ts) runs it like any other engine.

import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import { Sampler } from '../model/sampler.ts';
import type { SamplerOptions } from '../model/sampler.ts';
import type { Tokenizer } from '../model/tokenizer/tokenizer.ts';
import type { GenerationRequest, GenerationResult, TextGenerator } from '../model/generation-output.ts';
import type { TokenStepper } from '../model/token-stepper.ts';
import { generateWith } from './generation-loop.ts';

/**
 * The smallest thing generation needs from a route: per-session KV state on every stage and
 * a forward pass from token ids to the logits of the last position.
 */
export interface StageChain {
  /** opens the session on every stage, each with a KV cache of `contextLength` positions */
  openSession(sessionId: string, contextLength: number): Promise<void>;
  /**
   * Runs `tokens` at positions [position, position + n) through every stage and returns the
   * logits of the last one, [n_vocab]. `position` must be where the session stands
   * (POSITION_MISMATCH otherwise): nothing is ever recomputed.
   */
  forward(sessionId: string, tokens: Int32Array, position: number): Promise<Float32Array>;
  /** frees the session's KV cache on every stage */
  releaseSession(sessionId: string): Promise<void>;
}

/** A chain of StageBackends in this process: hidden states pass from one to the next. */
export class InProcessChain implements StageChain {
  /** wall time each stage spent computing, summed over calls, in ms */
  readonly stageComputeMs: number[];

  constructor(readonly stages: readonly StageBackend[]) {
    if (stages.length === 0) throw new MeshError('BAD_CHAIN', 'a chain needs at least one stage');
    this.stageComputeMs = stages.map(() => 0);
  }

  async openSession(sessionId: string, contextLength: number): Promise<void> {
    for (const s of this.stages) await s.openSession(sessionId, { contextLength });
  }

  async forward(sessionId: string, tokens: Int32Array, position: number): Promise<Float32Array> {
    let result = await this.stages[0]!.forward(sessionId, { kind: 'tokens', tokens }, position);
    this.stageComputeMs[0]! += result.computeMs;
    for (let i = 1; i < this.stages.length; i++) {
      const prev = result.output;
      if (prev.kind !== 'hidden') throw new MeshError('BAD_CHAIN', `stage ${i - 1} returned logits but is not the last stage`);
      result = await this.stages[i]!.forward(sessionId, { kind: 'hidden', hidden: prev.hidden, nTokens: prev.nTokens }, position);
      this.stageComputeMs[i]! += result.computeMs;
    }
    if (result.output.kind !== 'logits') throw new MeshError('BAD_CHAIN', 'the last stage returned hidden states, not logits');
    return result.output.logits;
  }

  async releaseSession(sessionId: string): Promise<void> {
    for (const s of this.stages) await s.releaseSession(sessionId);
  }

  async dispose(): Promise<void> {
    for (const s of this.stages) await s.dispose();
  }
}

const DEFAULT_PREFILL_CHUNK = 512;

/** One session on a StageChain as a TokenStepper: logits come from the chain, tokens from our Sampler. */
export class ChainStepper implements TokenStepper {
  position = 0;
  /** prompt and fed tokens, for the sampler's repetition penalty */
  private readonly history: number[] = [];
  private readonly sampler: Sampler;
  private closed = false;

  private constructor(
    private readonly chain: StageChain,
    readonly sessionId: string,
    readonly contextLength: number,
    sampler: SamplerOptions | undefined,
    private readonly prefillChunk: number,
  ) {
    this.sampler = new Sampler(sampler);
  }

  /** opens `sessionId` on every stage of `chain` with a KV cache of `contextLength` positions */
  static async open(chain: StageChain, sessionId: string, contextLength: number, sampler?: SamplerOptions, prefillChunk = DEFAULT_PREFILL_CHUNK): Promise<ChainStepper> {
    await chain.openSession(sessionId, contextLength);
    return new ChainStepper(chain, sessionId, contextLength, sampler, prefillChunk);
  }

  async prefill(prompt: readonly number[], onProgress?: (done: number, total: number) => void): Promise<number> {
    let logits!: Float32Array;
    for (let at = 0; at < prompt.length; at += this.prefillChunk) {
      const part = prompt.slice(at, at + this.prefillChunk);
      logits = await this.chain.forward(this.sessionId, Int32Array.from(part), at);
      onProgress?.(at + part.length, prompt.length);
    }
    this.position = prompt.length;
    this.history.push(...prompt);
    return this.sampler.sample(logits, this.history);
  }

  async decode(token: number): Promise<number> {
    this.history.push(token);
    const logits = await this.chain.forward(this.sessionId, Int32Array.of(token), this.position);
    this.position++;
    return this.sampler.sample(logits, this.history);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.chain.releaseSession(this.sessionId);
  }
}

/** Generation over a StageChain, sampled and decoded here. */
export class ChainGenerator implements TextGenerator {
  constructor(
    readonly chain: StageChain & { dispose?(): Promise<void> },
    readonly tokenizer: Tokenizer,
  ) {}

  generate(request: GenerationRequest): Promise<GenerationResult> {
    return generate(this.chain, this.tokenizer, request);
  }

  async dispose(): Promise<void> {
    await this.chain.dispose?.();
  }
}

/** Runs one generation over `chain` (see GenerationRequest); the session is released at the end. */
export function generate(chain: StageChain, tokenizer: Tokenizer, request: GenerationRequest): Promise<GenerationResult> {
  const sessionId = request.sessionId ?? `gen-${Math.random().toString(36).slice(2)}`;
  return generateWith(tokenizer, request, (contextLength) => ChainStepper.open(chain, sessionId, contextLength, request.sampler, request.prefillChunk));
}
