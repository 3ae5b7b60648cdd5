// Starts a native node's stage engine (workers/stage-engines.ts) in a worker thread
// (workers/stage.node-worker.ts). The thread runs the TypeScript sources as the node does,
// through tsx, registered in it first.

import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import type { CpuWorkerBackend } from '../src/backends/cpu/in-worker.ts';
import { WorkerStageBackend } from '../src/backends/in-worker.ts';
import { MeshError } from '../src/errors.ts';
import { THREAD_ENGINES } from './stage-engines.ts';
import type { ThreadEngine, ThreadEngines } from './stage-engines.ts';

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

/** `engine` in a new worker thread of this process, and that thread (tests end it to see a death). */
export function stageThread<E extends ThreadEngine>(engine: E, options: ThreadEngines[E]['options']): { backend: WorkerStageBackend<ThreadEngines[E]['info']>; worker: Worker } {
  const spec = THREAD_ENGINES[engine];
  const entry = new URL('./stage.node-worker.ts', import.meta.url).href;
  const bootstrap = `import(${JSON.stringify(tsxApiUrl())}).then((m) => { m.register(); return import(${JSON.stringify(entry)}); })`;
  const worker = new Worker(bootstrap, { eval: true, workerData: { engine, options }, name: `gguf-mesh ${engine} stage` });
  worker.unref(); // the node's sockets keep it alive, not its engine
  const died = new Promise<never>((_, reject) => {
    const fail = (what: string) => reject(new MeshError(spec.failCode, `the ${engine} stage thread failed: ${what}`));
    worker.on('error', (e) => fail(e.message));
    worker.on('messageerror', () => fail('a message could not be deserialised'));
    worker.on('exit', (code) => fail(`it exited (code ${code})`));
  });
  const backend = WorkerStageBackend.over<ThreadEngines[E]['info']>(nodeEndpoint(worker), died, () => worker.terminate(), spec);
  return { backend, worker };
}

/** A StageBackend computing `engine` in a new worker thread of this process. */
export function stageBackendInThread<E extends ThreadEngine>(engine: E, options: ThreadEngines[E]['options']): WorkerStageBackend<ThreadEngines[E]['info']> {
  return stageThread(engine, options).backend;
}

/** The CPU engine in a new worker thread. */
export function cpuBackendInThread(options: ThreadEngines['cpu']['options'] = {}): CpuWorkerBackend {
  return stageBackendInThread('cpu', options) as CpuWorkerBackend;
}
