// Every test process, and every process a test spawns, keeps its caches in this run's own
// folder (test/support/global-setup.ts), never in the developer's ~/.cache/gguf-mesh.
import { homedir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { meshCacheDir } from '../src/cache-dir.ts';

describe('test cache isolation', () => {
  it('points GGUF_MESH_CACHE at a per-run folder, and the cache rule follows it', () => {
    const dir = process.env.GGUF_MESH_CACHE;
    expect(dir).toMatch(/gguf-mesh-test-cache-/);
    expect(meshCacheDir()).toBe(dir);
    expect(meshCacheDir().startsWith(homedir() + '/.cache')).toBe(false);
  });
});
