// Starts a WebGPU stage in its own dedicated module worker. The `new Worker(new URL(…))` form
// lives here, beside the worker's entry, so bundlers emit the worker and backends/ never
// names an entry point.

import { WebGpuBackend } from '../src/backends/webgpu/backend.ts';
import type { WebGpuStageOptions } from '../src/backends/webgpu/stage.ts';

export function startWebGpuStageWorker(): Worker {
  return new Worker(new URL('./webgpu-stage.worker.ts', import.meta.url), { type: 'module', name: 'gguf-mesh webgpu stage' });
}

/** A WebGpuBackend whose GPU work runs in a new worker (see WebGpuBackend.inWorker). */
export function webGpuBackendInWorker(options: WebGpuStageOptions = {}, opts: { copyTensorBytes?: boolean } = {}): Promise<WebGpuBackend> {
  return WebGpuBackend.inWorker(startWebGpuStageWorker(), options, opts);
}
