// The generation loop: prefill the prompt through a chain of stages, then sample one token at
// a time and feed it back, streaming text deltas, until EOS/EOG, a stop string, the token
// limit or the context limit. The chain is anything that turns token ids into last-position
// logits: in-process stages here, a remote route over the network elsewhere.

import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import { Sampler } from '../model/sampler.ts';
import type { Tokenizer } from '../model/tokenizer/tokenizer.ts';
import { GenerationOutput } from '../model/generation-output.ts';
import type { GenerationRequest, GenerationResult, TextGenerator } from '../model/generation-output.ts';

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

/**
 * Checks a generation request's prompt and token budget (EMPTY_PROMPT, BAD_REQUEST for
 * maxTokens, CONTEXT_FULL) and returns the context length it runs in: the one asked for, or
 * exactly room for the prompt and maxTokens. Local and route generation both start here.
 */
export function generationContextLength(prompt: readonly number[], maxTokens: number, contextLength?: number): number {
  if (prompt.length === 0) throw new MeshError('EMPTY_PROMPT', 'the prompt has no tokens');
  if (!Number.isInteger(maxTokens) || maxTokens < 0) {
    throw new MeshError('BAD_REQUEST', `maxTokens must be a non-negative integer, got ${maxTokens}`);
  }
  const n = contextLength ?? prompt.length + maxTokens;
  if (prompt.length > n) {
    throw new MeshError('CONTEXT_FULL', `the prompt has ${prompt.length} tokens, more than the context length ${n}`);
  }
  return n;
}

/** Runs one generation over `chain` (see GenerationRequest). */
export async function generate(chain: StageChain, tokenizer: Tokenizer, request: GenerationRequest): Promise<GenerationResult> {
  const prompt = [...request.promptTokens];
  const contextLength = generationContextLength(prompt, request.maxTokens, request.contextLength);
  const sampler = new Sampler(request.sampler);
  const sessionId = request.sessionId ?? `gen-${Math.random().toString(36).slice(2)}`;
  const out = new GenerationOutput(tokenizer, request.stopStrings, request.onDelta);
  const { text, decoder, tokens } = out;

  await chain.openSession(sessionId, contextLength);
  try {
    // prefill, in chunks when asked
    const chunk = request.prefillChunk ?? DEFAULT_PREFILL_CHUNK;
    let t0 = performance.now();
    let logits!: Float32Array;
    for (let at = 0; at < prompt.length; at += chunk) {
      logits = await chain.forward(sessionId, Int32Array.from(prompt.slice(at, at + chunk)), at);
    }
    out.promptMs = performance.now() - t0;

    let position = prompt.length;
    while (tokens.length < request.maxTokens) {
      if (request.signal?.aborted) {
        out.stopReason = 'aborted';
        break;
      }
      const token = sampler.sample(logits, prompt.concat(tokens));
      tokens.push(token);
      if (tokenizer.isEog(token) && !request.ignoreEog) {
        out.stopReason = 'eog';
        break;
      }
      if (text.push(decoder.push(token))) {
        out.stopReason = 'stop_string';
        break;
      }
      if (tokens.length === request.maxTokens) break;
      if (position >= contextLength) {
        out.stopReason = 'context_full';
        break;
      }
      // decode: one token through the chain
      t0 = performance.now();
      logits = await chain.forward(sessionId, Int32Array.of(token), position);
      out.decodeMs += performance.now() - t0;
      out.decodeSteps++;
      position++;
    }
    out.finish();
  } finally {
    await chain.releaseSession(sessionId);
  }

  return out.result(prompt);
}

