// Starts a WebGPU stage in its own dedicated module worker. The worker's URL comes from the
// bundler (`?worker&url`: vite emits the worker and its chunks beside this module), so
// backends/ never names an entry point.
//
// Browsers start a worker only from a script of the page's own origin. When another site's
// page loaded this bundle (`<script type="module" src="https://room-server/components/…">`),
// the worker starts from a same-origin blob: URL whose one line imports the real worker module
// across origins — allowed for modules served with CORS, which the room server sends for
// /components/. The embedding page's CSP must then allow `worker-src blob: <room server>` (the
// worker's module imports are fetched as workers, so worker-src governs them; docs/web-components.md).

import workerUrl from './webgpu-stage.worker.ts?worker&url';
import { WebGpuBackend } from '../src/backends/webgpu/backend.ts';
import type { WebGpuStageOptions } from '../src/backends/webgpu/stage.ts';

const WORKER_OPTIONS: WorkerOptions = { type: 'module', name: 'gguf-mesh webgpu stage' };

export function startWebGpuStageWorker(): Worker {
  const url = new URL(workerUrl, import.meta.url);
  if (url.origin === self.location.origin) return new Worker(url, WORKER_OPTIONS);
  const blobUrl = URL.createObjectURL(new Blob([`import ${JSON.stringify(url.href)};\n`], { type: 'text/javascript' }));
  const worker = new Worker(blobUrl, WORKER_OPTIONS);
  // the worker has fetched its one-line script long before this (it only names the real module)
  setTimeout(() => URL.revokeObjectURL(blobUrl), 30_000);
  return worker;
}

/** A WebGpuBackend whose GPU work runs in a new worker (see WebGpuBackend.inWorker). */
export function webGpuBackendInWorker(options: WebGpuStageOptions = {}, opts: { copyTensorBytes?: boolean } = {}): Promise<WebGpuBackend> {
  return WebGpuBackend.inWorker(startWebGpuStageWorker(), options, opts);
}
