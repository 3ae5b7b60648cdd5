// What a stage keeps of one session (stage-service.ts), and what one frame's compute adds up to.

import type { MeshError } from '../errors.ts';
import type { DType } from '../protocol/frame.ts';
import type { StepTiming } from '../protocol/payload.ts';
import type { SamplerSettings } from '../protocol/session.ts';
import type { ReplayLog } from './replay-log.ts';
import type { StepTotals } from './stage-status.ts';

/** Picks a token from the logits; history: the session's tokens at positions [0, p) (for penalties). */
export type TokenSampler = (logits: Float32Array, history: readonly number[]) => number;
/** A sampler for a session's settings that has already made `draws` random draws. */
export type SamplerFactory = (settings: SamplerSettings, draws: number) => TokenSampler;

export interface StageSession {
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
  timing: StepTotals;
  /** the first failure of a pipelined prefill chunk downstream, reported on the next frame */
  pipelineError: MeshError | null;
  /** performance.now() of the session's last frame, for expiry */
  lastUsed: number;
  /** positions from here on are drafts of the last Verify frame (stage-verify.ts); Infinity: none */
  tentative: number;
  /** bumped by every Rewind: a frame that started before it neither logs nor goes downstream, and its late failures are not this session's */
  epoch: number;
  /** the session manager's ring generation (Rewind `ring`): stage 0 takes ring tokens of this one only */
  ringGeneration: number;
}

/** What one frame's compute adds up to (over its chunks), and the timing records it carries forward (ReturnDirect). */
export interface StepCost {
  computeMs: number;
  downstreamMs: number;
  bytesOut: number;
  /** waiting in the compute queue behind other sessions' work */
  queueMs: number;
  /** the records of the stages before (from the incoming Hidden frame's trailer) and this one's, as of now */
  records(): StepTiming[];
}
