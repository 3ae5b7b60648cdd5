// Finds the real test model: ../shared/models (beside the checkout, also in CI), else
// $GGUF_MESH_TEST_MODEL, else a one-time download from the public hub into a cache.
// Where none works it throws saying how to get it — a test never skips silently.
import { existsSync, mkdirSync, writeFileSync, renameSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from './cli.ts';

const STORIES_URL = 'https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf';

export async function stories260K(): Promise<string> {
  const shared = join(REPO_ROOT, '..', 'shared', 'models', 'stories260K.gguf');
  if (existsSync(shared)) return shared;
  const fromEnv = process.env.GGUF_MESH_TEST_MODEL;
  if (fromEnv && existsSync(fromEnv)) return fromEnv;
  const cacheDir = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'gguf-mesh');
  const cached = join(cacheDir, 'stories260K.gguf');
  if (existsSync(cached)) return cached;
  try {
    const res = await fetch(STORIES_URL);
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    mkdirSync(cacheDir, { recursive: true });
    writeFileSync(cached + '.part', new Uint8Array(await res.arrayBuffer()));
    renameSync(cached + '.part', cached);
    return cached;
  } catch (e) {
    throw new Error(
      `stories260K.gguf not found: looked in ${shared}, $GGUF_MESH_TEST_MODEL and ${cached}, ` +
        `and downloading ${STORIES_URL} failed (${(e as Error).message}). ` +
        `Put the file in ../shared/models/ or set GGUF_MESH_TEST_MODEL to its path.`,
    );
  }
}

/** Greedy continuation llama.cpp gives for "Once upon a time" on stories260K (DESIGN.md). */
export const STORIES_PROMPT_TOKENS = [1, 403, 407, 261, 378];
export const STORIES_CONTINUATION_PREFIX = ', there was a little girl named Lily. She loved to play outside in the p';
