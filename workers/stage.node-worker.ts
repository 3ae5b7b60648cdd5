// The worker thread that runs a native node's stage engine (CPU or llama.cpp), so the node's
// event loop stays free while a shard loads or a prefill chunk computes for seconds: it
// answers the server's heartbeat, reads frames and control messages meanwhile. The parent
// talks to it through comlink (src/backends/in-worker.ts; the API is
// src/backends/worker-api.ts); which engine, and its options, come as workerData.

import { parentPort, workerData } from 'node:worker_threads';
import * as Comlink from 'comlink';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import { threadEngineApi } from './stage-engines.ts';
import type { ThreadEngine, ThreadEngines } from './stage-engines.ts';

const { engine, options } = workerData as { engine: ThreadEngine; options: ThreadEngines[ThreadEngine]['options'] };
// the parent's first calls wait in the port's queue until this listens
Comlink.expose(await threadEngineApi(engine, options), nodeEndpoint(parentPort!));
