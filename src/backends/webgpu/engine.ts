// What the page-side backend needs from a WebGPU stage, whether the stage lives in this thread
// (Node with Dawn, tests) or in a Web Worker behind comlink. Errors cross the worker boundary
// as plain {name, code, message, details} and become MeshErrors again on this side.

import { toWireError as toWire } from '../wire.ts';
import type { WireError, WireResult } from '../wire.ts';
import type { ForwardResult, StageInput } from '../types.ts';
import type { AdapterSummary } from './device.ts';
import type { StageModel, WebGpuStage, WebGpuStageOptions } from './stage.ts';

export interface BufferStats {
  count: number;
  bytes: number;
}

/** One session's step in a batch, as the stage takes it (f32 hidden states: the WebGPU backend has no forwardRows). */
export interface EngineStep {
  sessionId: string;
  input: StageInput;
  position: number;
}

export interface StageEngine {
  readonly adapter: AdapterSummary;
  load(model: StageModel): Promise<void>;
  openSession(sessionId: string, contextLength: number): Promise<void>;
  releaseSession(sessionId: string): Promise<void>;
  truncateSession(sessionId: string, position: number): Promise<void>;
  forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult>;
  /** one-token steps of distinct sessions as one pass (WebGpuStage.forwardBatch) */
  forwardBatch(steps: EngineStep[]): Promise<ForwardResult[]>;
  bufferStats(): Promise<BufferStats>;
  /** resolves with why the GPU device was lost while the stage lived */
  whenLost(): Promise<string>;
  dispose(): Promise<void>;
}

export type { WireError, WireResult } from '../wire.ts';
export { fromWire } from '../wire.ts';

/** an error for the wire; anything but a MeshError is WEBGPU_WORKER_ERROR */
export function toWireError(e: unknown): WireError {
  return toWire(e, 'WEBGPU_WORKER_ERROR');
}

/** A stage in this thread, seen as a StageEngine. */
export function inThreadEngine(stage: WebGpuStage): StageEngine {
  return {
    adapter: stage.adapter,
    load: (model) => stage.load(model),
    openSession: (id, ctx) => stage.openSession(id, ctx),
    releaseSession: (id) => stage.releaseSession(id),
    truncateSession: (id, position) => stage.truncateSession(id, position),
    forward: (id, input, position) => stage.forward(id, input, position),
    forwardBatch: (steps) => stage.forwardBatch(steps),
    bufferStats: async () => stage.bufferStats(),
    whenLost: () => stage.lostReason,
    dispose: () => stage.dispose(),
  };
}

/** What the WebGPU stage worker (workers/webgpu-stage.worker.ts) answers over comlink. */
export interface WorkerApi {
  init(options: WebGpuStageOptions): Promise<WireResult<AdapterSummary>>;
  load(model: StageModel): Promise<WireResult<void>>;
  openSession(sessionId: string, contextLength: number): Promise<WireResult<void>>;
  releaseSession(sessionId: string): Promise<WireResult<void>>;
  truncateSession(sessionId: string, position: number): Promise<WireResult<void>>;
  forward(sessionId: string, input: StageInput, position: number): Promise<WireResult<ForwardResult>>;
  forwardBatch(steps: EngineStep[]): Promise<WireResult<ForwardResult[]>>;
  bufferStats(): Promise<WireResult<BufferStats>>;
  /** answers once the device is lost (a pending call until then) */
  whenLost(): Promise<WireResult<string>>;
  dispose(): Promise<WireResult<void>>;
}
