// The model `gguf-mesh serve` hosts when it is given none: a small random-weight GGUF (make-model's
// synthetic llama with a ChatML template), written once and cached, so a fresh machine with no
// network shows a working room. Its text is gibberish by design; pass --model for a real one.
//
// Cache: $GGUF_MESH_CACHE, else $XDG_CACHE_HOME/gguf-mesh, else ~/.cache/gguf-mesh — under models/.
// The folder name carries a hash of the options and the generator version, so a changed default
// is made afresh instead of serving a stale file.

import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { meshCacheDir as defaultCacheDir } from '../cache-dir.ts';
import type { MakeModelOptions } from './synthetic-model.ts';
import { makeModelFile, resolveModelOptions } from './synthetic-model.ts';

/**
 * Six layers so a room of two or three peers gets a real split; q8_0 runs on every backend
 * (CPU, llama.cpp, WebGPU) and keeps SwiftShader fast enough for a demo. ~3 MB on disk.
 */
export const DEFAULT_MODEL_OPTIONS: MakeModelOptions = {
  arch: 'llama',
  layers: 6,
  embd: 128,
  heads: 4,
  kvHeads: 2,
  ffn: 384,
  vocab: 1024,
  ctx: 2048,
  type: 'q8_0',
  seed: 1,
};

/** Bump when the generator's output for the same options changes. */
const GENERATOR_VERSION = 1;

export { defaultCacheDir };

export interface DefaultModel {
  path: string;
  /** true when this call wrote the file */
  made: boolean;
  /** one line for the terminal and the page */
  description: string;
}

/** The cached default model, made on first use (written beside and renamed: never half a file). */
export async function ensureDefaultModel(cacheDir = defaultCacheDir()): Promise<DefaultModel> {
  const o = resolveModelOptions(DEFAULT_MODEL_OPTIONS);
  const key = createHash('sha256').update(JSON.stringify({ v: GENERATOR_VERSION, o }, null, 0)).digest('hex').slice(0, 12);
  // the file name becomes the model id on the server, so the hash goes in the folder
  const dir = join(cacheDir, 'models', `default-${key}`);
  const path = join(dir, 'gguf-mesh-default.gguf');
  const description = `synthetic ${o.arch} ${o.type}, ${o.layers} layers × ${o.embd} (random weights: the text is gibberish; pass --model for a real model)`;
  if (existsSync(path)) return { path, made: false, description };
  mkdirSync(dir, { recursive: true });
  const partial = `${path}.${process.pid}.part`;
  try {
    await makeModelFile(partial, o);
    renameSync(partial, path);
  } finally {
    rmSync(partial, { force: true });
  }
  return { path, made: true, description };
}

/**
 * The models `serve` hosts: the ones named on the command line, else $GGUF_MESH_MODEL, else the
 * default model (made on first start). `describe` maps each location to a line for the page.
 */
export async function modelsToServe(named: string[], env: NodeJS.ProcessEnv = process.env): Promise<{ models: string[]; describe: Map<string, string>; made: boolean }> {
  if (named.length > 0) return { models: named, describe: new Map(), made: false };
  if (env.GGUF_MESH_MODEL) return { models: [env.GGUF_MESH_MODEL], describe: new Map(), made: false };
  const d = await ensureDefaultModel(defaultCacheDir(env));
  return { models: [d.path], describe: new Map([[d.path, d.description]]), made: d.made };
}
