// Where gguf-mesh keeps what it makes or downloads once (the default model, verified shards):
// $GGUF_MESH_CACHE, else $XDG_CACHE_HOME/gguf-mesh, else ~/.cache/gguf-mesh. One rule, so a
// test run that points GGUF_MESH_CACHE elsewhere isolates every cache at once.
import { homedir } from 'node:os';
import { join } from 'node:path';

export function meshCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.GGUF_MESH_CACHE) return env.GGUF_MESH_CACHE;
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'gguf-mesh');
}
