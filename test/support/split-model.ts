// Splits a synthetic model into GGUF parts the way llama.cpp's gguf-split does (`--split
// --split-max-tensors N`): tensors keep their order, a new part starts every N tensors, the
// first part carries all the model's metadata, and every part adds split.no (u16, 0-based),
// split.count (u16) and split.tensors.count (i32) after it. Parts are named
// `<prefix>-0000k-of-0000n.gguf`. The unsplit model (same bytes per tensor) is the reference.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { MakeModelOptions } from '../../src/model/synthetic-model.ts';
import { syntheticModelSpec } from '../../src/model/synthetic-model.ts';
import { readHeader } from '../../src/gguf/parse.ts';
import { writeGguf } from '../../src/gguf/writer.ts';
import type { MetadataEntry } from '../../src/gguf/writer.ts';
import { splitPartName } from '../../src/gguf/split.ts';
import { syntheticModel } from './synthetic.ts';

export interface SplitModel {
  /** the unsplit model */
  whole: string;
  /** the parts, in order */
  parts: string[];
  /** tensor names in each part */
  tensorsOf: string[][];
}

export async function splitSyntheticModel(options: MakeModelOptions, dir: string, prefix: string, maxTensors: number): Promise<SplitModel> {
  const whole = await syntheticModel(options);
  const header = await readHeader(whole);
  const bytes = readFileSync(whole);
  const metadata = syntheticModelSpec({ ...options, headerOnly: true }).metadata;
  const groups: (typeof header.tensors)[] = [];
  header.tensors.forEach((t, i) => {
    if (i % maxTensors === 0) groups.push([]);
    groups.at(-1)!.push(t);
  });
  const n = groups.length;
  mkdirSync(dir, { recursive: true });
  const parts = groups.map((tensors, k) => {
    const split: MetadataEntry[] = [
      { key: 'split.no', type: 'uint16', value: k },
      { key: 'split.count', type: 'uint16', value: n },
      { key: 'split.tensors.count', type: 'int32', value: header.tensors.length },
    ];
    const file = writeGguf({
      metadata: k === 0 ? [...metadata, ...split] : split,
      tensors: tensors.map((t) => ({ name: t.name, type: t.type, shape: t.shape, data: bytes.subarray(t.offset, t.offset + t.byteLength) })),
    });
    const path = join(dir, splitPartName(prefix, k, n));
    writeFileSync(path, file);
    return path;
  });
  return { whole, parts, tensorsOf: groups.map((g) => g.map((t) => t.name)) };
}
