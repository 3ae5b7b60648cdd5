// The dedicated module worker that owns a GPUDevice and one WebGPU stage. The page talks to it
// through comlink (src/backends/webgpu/backend.ts). Every method answers a WireResult, so
// errors keep their MeshError code across the thread boundary; outputs are transferred.

import * as Comlink from 'comlink';
import { acquireDevice } from '../src/backends/webgpu/device.ts';
import type { AdapterSummary } from '../src/backends/webgpu/device.ts';
import { toWireError } from '../src/backends/webgpu/engine.ts';
import type { BufferStats, EngineStep, WireResult, WorkerApi } from '../src/backends/webgpu/engine.ts';
import { SHADERS } from '../src/backends/webgpu/shaders-vite.ts';
import { WebGpuStage } from '../src/backends/webgpu/stage.ts';
import type { StageModel, WebGpuStageOptions } from '../src/backends/webgpu/stage.ts';
import { MeshError } from '../src/errors.ts';
import type { ForwardResult, StageInput } from '../src/backends/types.ts';

let stage: WebGpuStage | null = null;
/** buffer counts the stage reported after dispose (what a leak check asks for) */
let disposedStats: BufferStats | null = null;

async function wrap<T>(fn: () => Promise<T> | T): Promise<WireResult<T>> {
  try {
    return { ok: true, value: await fn() };
  } catch (e) {
    return { ok: false, error: toWireError(e) };
  }
}

function current(): WebGpuStage {
  if (!stage) throw new MeshError('NOT_INITIALISED', 'the WebGPU worker has no device yet; call init() first');
  return stage;
}

const api: WorkerApi = {
  init: (options: WebGpuStageOptions): Promise<WireResult<AdapterSummary>> =>
    wrap(async () => {
      if (stage) throw new MeshError('ALREADY_INITIALISED', 'this WebGPU worker already has a device');
      const { device, adapter } = await acquireDevice(self.navigator.gpu, 'gguf-mesh stage (worker)');
      stage = new WebGpuStage(device, adapter, SHADERS, options);
      return adapter;
    }),
  load: (model: StageModel): Promise<WireResult<void>> => wrap(() => current().load(model)),
  openSession: (sessionId: string, contextLength: number): Promise<WireResult<void>> => wrap(() => current().openSession(sessionId, contextLength)),
  releaseSession: (sessionId: string): Promise<WireResult<void>> => wrap(() => current().releaseSession(sessionId)),
  truncateSession: (sessionId: string, position: number): Promise<WireResult<void>> => wrap(() => current().truncateSession(sessionId, position)),
  forward: async (sessionId: string, input: StageInput, position: number): Promise<WireResult<ForwardResult>> => {
    const r = await wrap(() => current().forward(sessionId, input, position));
    if (!r.ok) return r;
    const out = r.value.output;
    const buffer = (out.kind === 'logits' ? out.logits : out.hidden).buffer as ArrayBuffer;
    return Comlink.transfer(r, [buffer]);
  },
  forwardBatch: async (steps: EngineStep[]): Promise<WireResult<ForwardResult[]>> => {
    const r = await wrap(() => current().forwardBatch(steps));
    if (!r.ok) return r;
    return Comlink.transfer(r, r.value.map(({ output: out }) => (out.kind === 'logits' ? out.logits : out.hidden).buffer as ArrayBuffer));
  },
  whenLost: (): Promise<WireResult<string>> => wrap(() => current().lostReason),
  bufferStats: (): Promise<WireResult<BufferStats>> => wrap(() => (!stage && disposedStats ? disposedStats : current().bufferStats())),
  dispose: (): Promise<WireResult<void>> =>
    wrap(async () => {
      if (!stage) return;
      const s = stage;
      stage = null;
      await s.dispose();
      disposedStats = s.bufferStats();
      s.device.destroy();
    }),
};

Comlink.expose(api);
