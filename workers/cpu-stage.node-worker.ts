// The worker thread that runs a native node's CPU engine, so the node's event loop stays free
// while a shard loads or a prefill chunk computes for seconds: it answers the server's
// heartbeat, reads frames and control messages meanwhile. The parent talks to it through
// comlink (src/backends/cpu/in-worker.ts; the API is src/backends/cpu/worker-api.ts); the
// engine's kernel threads are this thread and the workers it starts (node-threads.ts).

import { parentPort, workerData } from 'node:worker_threads';
import * as Comlink from 'comlink';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import type { CpuBackendOptions } from '../src/backends/cpu/backend.ts';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import { cpuWorkerApi } from '../src/backends/cpu/worker-api.ts';

const options = workerData as Pick<CpuBackendOptions, 'threads' | 'weightStorage'>;
Comlink.expose(
  cpuWorkerApi(() => createNodeCpuBackend(options)),
  nodeEndpoint(parentPort!),
);
