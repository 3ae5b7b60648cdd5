// A model copy whose bytes fail verification: one byte of one tensor flipped, with the
// original's manifest cached beside it (newer than the copy, same size), so `serve` hands out
// the original's hashes and every peer reading that tensor must refuse it.
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildManifest, manifestJson } from '../../src/gguf/manifest.ts';
import { readHeader } from '../../src/gguf/parse.ts';
import type { TensorInfo } from '../../src/gguf/types.ts';

/** Writes `<dir>/<name>` = `model` with byte `at` of the first tensor `pick` accepts XOR-ed with `mask`. */
export async function tamperedCopy(model: string, dir: string, name: string, pick: (tensor: string) => boolean, at = 17, mask = 0x40): Promise<{ path: string; victim: TensorInfo }> {
  const path = join(dir, name);
  copyFileSync(model, path);
  const victim = (await readHeader(path)).tensors.find((t) => pick(t.name));
  if (!victim) throw new Error(`no tensor of ${model} to tamper with`);
  const bytes = readFileSync(path);
  bytes[victim.offset + at]! ^= mask;
  writeFileSync(path, bytes);
  writeFileSync(`${path}.manifest.json`, manifestJson(await buildManifest(model)));
  return { path, victim };
}
