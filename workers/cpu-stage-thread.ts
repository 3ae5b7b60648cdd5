// Starts a native node's CPU engine in a worker thread (workers/cpu-stage.node-worker.ts). The
// thread runs the TypeScript sources as the node does, through tsx, registered in it first.

import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import type { CpuBackendOptions } from '../src/backends/cpu/backend.ts';
import { CpuWorkerBackend } from '../src/backends/cpu/in-worker.ts';
import { MeshError } from '../src/errors.ts';

/**
 * tsx's ESM API as a file URL. An eval'd worker resolves no bare specifier from here, and the
 * package's CommonJS build registers hooks at a path of its own that does not exist.
 */
function tsxApiUrl(): string {
  const require = createRequire(import.meta.url);
  const manifest = require.resolve('tsx/package.json');
  const exports = (require(manifest) as { exports: Record<string, { import: { default: string } }> }).exports;
  return new URL(exports['./esm/api']!.import.default, pathToFileURL(manifest)).href;
}

/** A CPU StageBackend computing in a new worker thread of this process. */
export function cpuBackendInThread(options: Pick<CpuBackendOptions, 'threads' | 'weightStorage'> = {}): CpuWorkerBackend {
  const entry = new URL('./cpu-stage.node-worker.ts', import.meta.url).href;
  const bootstrap = `import(${JSON.stringify(tsxApiUrl())}).then((m) => { m.register(); return import(${JSON.stringify(entry)}); })`;
  const worker = new Worker(bootstrap, { eval: true, workerData: options, name: 'gguf-mesh cpu stage' });
  worker.unref(); // the node's sockets keep it alive, not its engine
  const died = new Promise<never>((_, reject) => {
    const fail = (what: string) => reject(new MeshError('CPU_WORKER_FAILED', `the CPU stage thread failed: ${what}`));
    worker.on('error', (e) => fail(e.message));
    worker.on('messageerror', () => fail('a message could not be deserialised'));
    worker.on('exit', (code) => fail(`it exited (code ${code})`));
  });
  return CpuWorkerBackend.over(nodeEndpoint(worker), died, () => worker.terminate());
}
