// Synthetic models for tests and benchmarks, made once and cached under .cache/models.
// The cache key covers the resolved options and the source of the code that writes models,
// so a change to the generator never serves a stale file.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import type { MakeModelOptions } from '../../src/model/synthetic-model.ts';
import { makeModelFile, resolveModelOptions } from '../../src/model/synthetic-model.ts';
import { REPO_ROOT } from './cli.ts';

export const MODEL_CACHE_DIR = join(REPO_ROOT, '.cache', 'models');

const GENERATOR_SOURCES = [
  'src/model/synthetic-model.ts',
  'src/model/synthetic-tensors.ts',
  'src/model/synthetic-qwen35.ts',
  'src/model/synthetic-vocab.ts',
  'src/gguf/quantize.ts',
  'src/gguf/quantize-legacy.ts',
  'src/gguf/quantize-k.ts',
  'src/gguf/quantize-nl.ts',
  'src/gguf/quant-search.ts',
  'src/gguf/codebooks.ts',
  'src/gguf/writer.ts',
  'src/gguf/fp16.ts',
];

let generatorHash: string | undefined;

function sourceHash(): string {
  if (!generatorHash) {
    const h = createHash('sha256');
    for (const f of GENERATOR_SOURCES) h.update(readFileSync(join(REPO_ROOT, f)));
    generatorHash = h.digest('hex');
  }
  return generatorHash;
}

/** The cached path for these options (made on first use). */
export async function syntheticModel(options: MakeModelOptions = {}): Promise<string> {
  const o = resolveModelOptions(options);
  const key = createHash('sha256').update(sourceHash()).update(JSON.stringify(o, Object.keys(o).sort())).digest('hex').slice(0, 16);
  const name = `${o.arch}-${o.type}-${o.layers}x${o.embd}-v${o.vocab}${o.headerOnly ? '-header' : ''}-${key}.gguf`;
  const path = join(MODEL_CACHE_DIR, name);
  if (existsSync(path)) return path;
  mkdirSync(MODEL_CACHE_DIR, { recursive: true });
  // write beside and rename, so a concurrent test process never reads a half-written file
  const partial = `${path}.${process.pid}.part`;
  await makeModelFile(partial, o);
  renameSync(partial, path);
  return path;
}
