// What every generation loop needs from an engine: run the prompt and get the first generated
// token, then feed each token and get the next. Who samples (our Sampler beside a chain of
// stages, a route's last stage, llama.cpp) and where the KV cache lives is the stepper's
// business; the one loop (route/generation-loop.ts) turns tokens into text and decides when to
// stop.

import type { SamplerOptions } from './sampler.ts';

export interface TokenStepper {
  /** KV positions this context holds; generation stops with `context_full` when they run out */
  readonly contextLength: number;
  /** where the next token fed to decode() goes: the prompt length after prefill, +1 per decode */
  readonly position: number;
  /**
   * Runs the prompt from position 0 (in chunks where the engine wants them, reporting tokens
   * done after each) and returns the first generated token.
   */
  prefill(prompt: readonly number[], onProgress?: (done: number, total: number) => void): Promise<number>;
  /** Feeds `token` (the one just generated) at `position` and returns the next one. */
  decode(token: number): Promise<number>;
  /** Frees the context (KV cache, sequence or session); a second call does nothing. */
  close(): Promise<void>;
}

export interface StepperOptions {
  /** KV positions to hold (the engine may hold fewer: it says so in the stepper's contextLength) */
  contextLength: number;
  sampler?: SamplerOptions;
  /** prompt tokens per forward call, where the engine chunks the prompt itself */
  prefillChunk?: number;
}

/** An engine that opens one stepper per generation (llama.cpp's whole model, for one). */
export interface StepperSource {
  openStepper(options: StepperOptions): Promise<TokenStepper>;
  dispose(): Promise<void>;
}
