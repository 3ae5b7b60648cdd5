// Runs once per `vitest run`, before any test process starts: every cache gguf-mesh keeps
// (default model, verified shards) goes to a fresh folder for this run, so what an earlier run
// or a developer left in ~/.cache/gguf-mesh cannot change a route's plan, and is removed after.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export default function setup(): () => void {
  const dir = mkdtempSync(join(tmpdir(), 'gguf-mesh-test-cache-'));
  process.env.GGUF_MESH_CACHE = dir;
  return () => rmSync(dir, { recursive: true, force: true });
}
