// What the page-side backend needs from a WebGPU stage, whether the stage lives in this thread
// (Node with Dawn, tests) or in a Web Worker behind comlink. Errors cross the worker boundary
// as plain {name, code, message, details} and become MeshErrors again on this side.

import { MeshError } from '../../errors.ts';
import type { ForwardResult, StageInput } from '../types.ts';
import type { AdapterSummary } from './device.ts';
import type { StageModel, WebGpuStage, WebGpuStageOptions } from './stage.ts';

export interface BufferStats {
  count: number;
  bytes: number;
}

export interface StageEngine {
  readonly adapter: AdapterSummary;
  load(model: StageModel): Promise<void>;
  openSession(sessionId: string, contextLength: number): Promise<void>;
  releaseSession(sessionId: string): Promise<void>;
  truncateSession(sessionId: string, position: number): Promise<void>;
  forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult>;
  bufferStats(): Promise<BufferStats>;
  /** resolves with why the GPU device was lost while the stage lived */
  whenLost(): Promise<string>;
  dispose(): Promise<void>;
}

/** An error as it travels between threads. */
export interface WireError {
  name: string;
  code: string;
  message: string;
  details?: Record<string, unknown>;
}

export type WireResult<T> = { ok: true; value: T } | { ok: false; error: WireError };

export function toWireError(e: unknown): WireError {
  if (e instanceof MeshError) return { name: e.name, code: e.code, message: e.message, details: e.details };
  if (e instanceof Error) return { name: e.name, code: 'WEBGPU_WORKER_ERROR', message: e.message };
  return { name: 'Error', code: 'WEBGPU_WORKER_ERROR', message: String(e) };
}

export function fromWire<T>(r: WireResult<T>): T {
  if (r.ok) return r.value;
  throw MeshError.fromWire(r.error.code, r.error.message, r.error.details);
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
  bufferStats(): Promise<WireResult<BufferStats>>;
  /** answers once the device is lost (a pending call until then) */
  whenLost(): Promise<WireResult<string>>;
  dispose(): Promise<WireResult<void>>;
}
