// Backends a test file loads from model files: each one disposed, and its source closed, after
// the file's tests.
import { afterAll } from 'vitest';
import type { ShardRange, StageBackend } from '../../src/backends/types.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { TensorSource } from '../../src/gguf/types.ts';

/** Call at a test file's top level; the function it returns loads `shard` of `path` into a backend. */
export function engineLoader(): <B extends StageBackend>(backend: B, path: string, shard: ShardRange) => Promise<B> {
  const opened: StageBackend[] = [];
  const sources: TensorSource[] = [];
  afterAll(async () => {
    await Promise.all(opened.map((b) => b.dispose()));
    await Promise.all(sources.map((s) => s.close()));
  });
  return async (backend, path, shard) => {
    opened.push(backend);
    const source = await openTensorSource(path);
    sources.push(source);
    await backend.load(source, shard);
    return backend;
  };
}
