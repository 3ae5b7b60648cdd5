// Browser-project global setup (runs in Node before the browser tests): makes the real test
// model reachable from the page by linking it under .cache/test-models/, which vite serves
// (with Range support) from the project root — ../shared is outside vite's allowed folders —
// with its manifest beside it (browser peers get the manifest from the server; building one
// needs node:crypto).
import { existsSync, mkdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildManifest, manifestJson } from '../../src/gguf/manifest.ts';
import { REPO_ROOT } from '../support/cli.ts';
import { stories260K } from '../support/models.ts';

export const SERVED_MODELS_DIR = join(REPO_ROOT, '.cache', 'test-models');

export default async function setup(): Promise<void> {
  const target = await stories260K(); // throws, saying how to get it, when it is nowhere
  mkdirSync(SERVED_MODELS_DIR, { recursive: true });
  const link = join(SERVED_MODELS_DIR, 'stories260K.gguf');
  if (existsSync(link)) rmSync(link);
  symlinkSync(target, link);
  writeFileSync(join(SERVED_MODELS_DIR, 'stories260K.manifest.json'), manifestJson(await buildManifest(target)));
}
