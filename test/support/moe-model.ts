// A tiny qwen3moe GGUF for tests: an architecture llama.cpp runs whole but not through its
// layer-range path. Built from the synthetic qwen3
// spec (src/model/synthetic-model.ts): the dense feed-forward of every block replaced by 4
// experts (2 used per token) and a router, random F32, keys renamed to qwen3moe.*, as
// llama.cpp's src/models/qwen3moe.cpp loads them. Made once per run into .cache/models.
import { existsSync, mkdirSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { GgmlType } from '../../src/gguf/types.ts';
import { writeGgufFile } from '../../src/gguf/writer.ts';
import type { MetadataEntry, TensorSpec } from '../../src/gguf/writer.ts';
import { Prng } from '../../src/model/prng.ts';
import { syntheticModelSpec } from '../../src/model/synthetic-model.ts';
import { MODEL_CACHE_DIR } from './synthetic.ts';

const LAYERS = 2;
const EMBD = 64;
const EXPERTS = 4;
const EXPERT_FFN = 64;

function randomF32(shape: number[], std: number, seed: number): Uint8Array {
  const rng = new Prng(seed);
  const n = shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (rng.next() * 2 - 1) * std * Math.sqrt(3);
  return new Uint8Array(out.buffer);
}

export async function qwen3MoeModel(): Promise<string> {
  const path = join(MODEL_CACHE_DIR, `qwen3moe-f32-${LAYERS}x${EMBD}-e${EXPERTS}.gguf`);
  if (existsSync(path)) return path;
  const dense = syntheticModelSpec({ arch: 'qwen3', layers: LAYERS, embd: EMBD, heads: 4, kvHeads: 2, ffn: 128, vocab: 1024 });
  const metadata: MetadataEntry[] = dense.metadata.map((m) =>
    m.key === 'general.architecture' ? { key: m.key, type: 'string', value: 'qwen3moe' } : m.key.startsWith('qwen3.') ? { ...m, key: m.key.replace(/^qwen3\./, 'qwen3moe.') } : m,
  );
  metadata.push(
    { key: 'qwen3moe.expert_count', type: 'uint32', value: EXPERTS },
    { key: 'qwen3moe.expert_used_count', type: 'uint32', value: 2 },
    { key: 'qwen3moe.expert_feed_forward_length', type: 'uint32', value: EXPERT_FFN },
  );
  const tensors: TensorSpec[] = dense.tensors.filter((t) => !/\.ffn_(gate|up|down)\.weight$/.test(t.name));
  for (let i = 0; i < LAYERS; i++) {
    const f32 = (name: string, shape: number[], std: number): void => {
      tensors.push({ name: `blk.${i}.${name}`, type: GgmlType.F32, shape, data: randomF32(shape, std, 1000 * i + tensors.length) });
    };
    f32('ffn_gate_inp.weight', [EMBD, EXPERTS], 1 / Math.sqrt(EMBD));
    f32('ffn_gate_exps.weight', [EMBD, EXPERT_FFN, EXPERTS], 1 / Math.sqrt(EMBD));
    f32('ffn_up_exps.weight', [EMBD, EXPERT_FFN, EXPERTS], 1 / Math.sqrt(EMBD));
    f32('ffn_down_exps.weight', [EXPERT_FFN, EMBD, EXPERTS], 1 / Math.sqrt(EXPERT_FFN));
  }
  mkdirSync(MODEL_CACHE_DIR, { recursive: true });
  const partial = `${path}.${process.pid}.part`;
  await writeGgufFile(partial, { metadata, tensors });
  renameSync(partial, path);
  return path;
}
