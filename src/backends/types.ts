// The stage backend interface: one contiguous layer range of one artifact, with a KV cache
// per session. CPU reference, WebGPU and llama.cpp backends all implement it, in-thread or
// behind a worker proxy.

import { MeshError } from '../errors.ts';
import type { TensorSource } from '../gguf/types.ts';

export type { ShardRange } from '../gguf/types.ts';
import type { ShardRange } from '../gguf/types.ts';

export type StageInput =
  /** first stage: token ids */
  | { kind: 'tokens'; tokens: Int32Array }
  /** later stages: hidden states, row-major [nTokens × n_embd] */
  | { kind: 'hidden'; hidden: Float32Array; nTokens: number };

export type StageOutput =
  /** hidden states after the shard's last layer, row-major [nTokens × n_embd] */
  | { kind: 'hidden'; hidden: Float32Array; nTokens: number }
  /** logits of the last position, [n_vocab], when the shard holds the head */
  | { kind: 'logits'; logits: Float32Array };

/**
 * Hidden states as frames carry them, [nTokens × width] f16 or f32 bytes: what a backend that
 * computes in native memory takes and gives (`forwardRows`), converting once on each side.
 */
export interface HiddenRows {
  kind: 'rows';
  dtype: 'f16' | 'f32';
  bytes: Uint8Array;
  nTokens: number;
  /** elements per token (the frame's width) */
  width: number;
}

export interface RowsForwardResult {
  output: HiddenRows | { kind: 'logits'; logits: Float32Array };
  computeMs: number;
}

export interface ForwardResult {
  output: StageOutput;
  /** wall time spent computing this call, in milliseconds */
  computeMs: number;
}

/** One session's decode step in a batch (`forwardBatch`): one token (first stage) or one hidden row. */
export interface BatchStep {
  sessionId: string;
  input: StageInput | HiddenRows;
  position: number;
  /** hidden states out as rows in this dtype, where the backend answers rows (as forwardRows) */
  outDtype: 'f16' | 'f32';
}

export interface SessionOptions {
  /** maximum positions the session's KV cache holds */
  contextLength: number;
}

export interface SessionStats {
  /** next position the session expects (= tokens in its KV cache) */
  position: number;
  /** bytes held by this session's KV cache on this stage */
  kvBytes: number;
  /** tokens processed by each layer of the shard (index 0 = shard.start) since the session opened */
  processedTokens: number[];
  /** bytes of fixed-size recurrent state (Gated DeltaNet layers, with its rewind checkpoint), when the shard has any */
  recurrentBytes?: number;
}

/** Throws POSITION_MISMATCH unless 0 <= position <= current (what truncateSession accepts). */
export function checkTruncate(sessionId: string, position: number, current: number): void {
  if (!Number.isInteger(position) || position < 0 || position > current) {
    throw new MeshError('POSITION_MISMATCH', `session ${sessionId} holds ${current} positions; cannot rewind it to ${position}`, { expected: current, got: position });
  }
}

export interface StageBackend {
  readonly kind: 'cpu' | 'webgpu' | 'llamacpp' | 'stub';
  /** read only this shard's tensors from `source` and make them ready to compute */
  load(source: TensorSource, shard: ShardRange): Promise<void>;
  openSession(sessionId: string, options: SessionOptions): Promise<void>;
  /** free the session's KV cache; releasing an unknown session is an error */
  releaseSession(sessionId: string): Promise<void>;
  /**
   * Drops positions [position, current) from the session's KV cache, so the next forward starts
   * at `position` (a repair rewinding a step that did not finish on every stage). `position`
   * beyond the current one is POSITION_MISMATCH.
   */
  truncateSession(sessionId: string, position: number): Promise<void>;
  /**
   * Run the shard's layers over `input` at positions [position, position + nTokens).
   * `position` must equal the session's current position: a mismatch is an error, never a
   * silent recompute.
   */
  forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult>;
  /**
   * Optional: `forward` with hidden states in (and, when the shard has no head, out) as
   * encoded rows in `outDtype`, for backends that compute in native memory — the stage
   * service then hands frame payloads through without decoding them in JS.
   */
  forwardRows?(sessionId: string, input: StageInput | HiddenRows, position: number, outDtype: 'f16' | 'f32'): Promise<RowsForwardResult>;
  /**
   * Optional: one-token steps of distinct sessions run as one pass (the weights read once for
   * all of them), each against its own session's KV: every result equal, bit for bit, to that
   * step's own `forward` (or `forwardRows` where the backend has it) — llama.cpp's within the
   * bounds its range stage states, its batched kernels summing in another order. A failure
   * changes no session, so the caller may run the steps one by one instead.
   */
  forwardBatch?(steps: readonly BatchStep[]): Promise<Array<ForwardResult | RowsForwardResult>>;
  sessionStats(sessionId: string): SessionStats;
  /**
   * Optional: resolves with why the backend's device was lost (a GPU reset, a crashed GPU
   * process) while it held its shard; never after dispose. The stage cannot compute again.
   */
  deviceLost?(): Promise<string>;
  /** free every buffer, worker and session */
  dispose(): Promise<void>;
}
