// A route session sampled here instead of on the last stage, under a token constraint (a
// grammar: JSON, a JSON schema): every step asks the last stage for its logits (WantLogits:
// n_vocab × 4 bytes back per token instead of one id), masks the tokens the constraint forbids,
// samples with llama.cpp's chain (model/sampler.ts) over the session's own history, and tells
// the constraint which token came. Kept apart from the stages so that no stage — browser tab,
// native node, llama.cpp — needs a grammar engine or the vocabulary.

import { MeshError } from '../errors.ts';
import { Sampler, tokenLogprob } from '../model/sampler.ts';
import type { SamplerOptions } from '../model/sampler.ts';
import type { SampledLogprob } from '../protocol/payload.ts';
import { ClientStepper } from './client.ts';
import type { RouteSessionClient } from './client.ts';
import type { TimedStepper } from './generation-loop.ts';

/** Which tokens may come next, and what came. */
export interface TokenConstraint {
  /** a bitmask over the vocabulary: bit (id & 31) of word (id >> 5) set = allowed */
  allowed(): Promise<Int32Array>;
  /** the token sampled; false when the constraint rejects it */
  accept(token: number): boolean;
  dispose(): void;
}

export class ConstrainedStepper extends ClientStepper implements TimedStepper {
  private readonly sampler: Sampler;
  private readonly history: number[] = [];
  lastLogprob: SampledLogprob | null = null;

  constructor(
    client: RouteSessionClient,
    contextLength: number,
    private readonly prefillChunk: number,
    private readonly constraint: TokenConstraint,
    sampler: SamplerOptions,
    private readonly logprobs: number | null,
  ) {
    super(client, contextLength);
    this.sampler = new Sampler(sampler);
  }

  async prefill(prompt: readonly number[], onProgress?: (done: number, total: number) => void): Promise<number> {
    this.history.push(...prompt);
    return this.pick(await this.client.prefillLogits(prompt, this.prefillChunk, onProgress));
  }

  async decode(token: number): Promise<number> {
    this.history.push(token);
    return this.pick(await this.client.logits([token]));
  }

  async close(): Promise<void> {
    this.constraint.dispose();
    await this.client.close();
  }

  private async pick(logits: Float32Array): Promise<number> {
    const mask = await this.constraint.allowed();
    const masked = logits.slice();
    for (let id = 0; id < masked.length; id++) if (!((mask[id >> 5]! >>> (id & 31)) & 1)) masked[id] = -Infinity;
    const token = this.sampler.sample(masked, this.history);
    if (!this.constraint.accept(token)) throw new MeshError('INTERNAL', `the output constraint rejected token ${token}, which its own mask allowed`);
    this.lastLogprob = this.logprobs === null ? null : tokenLogprob(logits, token, this.logprobs);
    return token;
  }
}
