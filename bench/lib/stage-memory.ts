// Resident memory of one stage, measured in a process of its own (so nothing else the bench
// loaded is counted): `node --expose-gc bin/run-ts.js bench/lib/stage-memory.ts <model>
// <cpu|llamacpp> <threads> <context>` loads the whole model as one stage, fills a session's KV
// cache to `context` positions, and prints one JSON line: RSS before loading (the runtime
// itself) and after, the shard's tensor bytes and the session's KV bytes.

import { createNodeCpuBackend } from '../../src/backends/cpu/node-threads.ts';
import { LlamaCppStage } from '../../src/backends/llamacpp/stage.ts';
import type { StageBackend } from '../../src/backends/types.ts';
import { shardBytes } from '../../src/backends/shard.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import { configFromHeader } from '../../src/model/config.ts';

const [model, kind, threadsText, contextText] = process.argv.slice(2);
const threads = Number(threadsText);
const context = Number(contextText);
const gc = (globalThis as { gc?: () => void }).gc ?? (() => {});
/** RSS after collections, once freed array buffers are returned (V8 releases them lazily) */
const rss = async (): Promise<number> => {
  for (let i = 0; i < 5; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    gc();
    if (process.memoryUsage().arrayBuffers < 16 << 20) break;
  }
  return process.memoryUsage().rss;
};

const source = await openTensorSource(model!);
const cfg = configFromHeader(source.header);
const shard = { start: 0, end: cfg.nLayer };
const stage: StageBackend = kind === 'llamacpp' ? new LlamaCppStage({ threads, kvType: 'f32', flashAttention: false }) : createNodeCpuBackend({ threads });
const before = await rss();
await stage.load(source, shard);
await stage.openSession('m', { contextLength: context });
const tokens = Int32Array.from({ length: context }, (_, i) => 1 + ((i * 37) % (cfg.nVocab - 1)));
for (let at = 0; at < context; at += 256) await stage.forward('m', { kind: 'tokens', tokens: tokens.subarray(at, at + 256) }, at);
const after = await rss();
const kvBytes = stage.sessionStats('m').kvBytes;
const mu = process.memoryUsage();
console.log(JSON.stringify({ rss_before_load: before, rss_loaded: after, heap_used: mu.heapUsed, array_buffers: mu.arrayBuffers, engine_memory: (stage as { memoryBytes?: number }).memoryBytes ?? null, shard_bytes: shardBytes(source.header, shard, cfg.nLayer), kv_bytes: kvBytes }));
await stage.dispose();
await source.close();
