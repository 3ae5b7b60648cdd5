// llama.cpp's own tokenizer fixtures, extracted at test time from the git bundle node-llama-cpp
// ships: vocabulary-only GGUFs of real tokenizers with .inp/.out cases, and real chat templates.
// Extracted once into .cache/ (git-ignored); never committed.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { MetadataEntry } from '../src/gguf/writer.ts';
import { REPO_ROOT } from './support/cli.ts';

const BUNDLE = join(REPO_ROOT, 'node_modules', 'node-llama-cpp', 'llama', 'gitRelease.bundle');
const CHECKOUT = join(REPO_ROOT, '.cache', 'llama.cpp');

export function llamaCppCheckout(): string {
  if (existsSync(join(CHECKOUT, 'models', 'ggml-vocab-llama-spm.gguf'))) return CHECKOUT;
  if (!existsSync(BUNDLE)) throw new Error(`llama.cpp bundle not found at ${BUNDLE}; run npm install`);
  mkdirSync(join(REPO_ROOT, '.cache'), { recursive: true });
  const tmp = `${CHECKOUT}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  execFileSync('git', ['clone', '-q', BUNDLE, tmp], { stdio: 'ignore' });
  // another test process may have finished first; either copy is the same
  if (!existsSync(CHECKOUT)) renameSync(tmp, CHECKOUT);
  else rmSync(tmp, { recursive: true, force: true });
  return CHECKOUT;
}

export function vocabPath(name: string): string {
  return join(llamaCppCheckout(), 'models', `ggml-vocab-${name}.gguf`);
}

export function templatePath(name: string): string {
  return join(llamaCppCheckout(), 'models', 'templates', `${name}.jinja`);
}

/** The .inp/.out cases of one vocabulary: expected ids without BOS, specials not parsed. */
export function vocabCases(name: string): { text: string; ids: number[] }[] {
  const base = vocabPath(name);
  const inputs = readFileSync(`${base}.inp`, 'utf8').split('\n__ggml_vocab_test__\n');
  const outputs = readFileSync(`${base}.out`, 'utf8').split('\n');
  return inputs.map((text, i) => {
    const line = (outputs[i] ?? '').trim();
    return { text, ids: line === '' ? [] : line.split(' ').map(Number) };
  });
}

/** The hyper-parameters llama.cpp reads before a vocabulary, per architecture (values only have to load). */
const VOCAB_ONLY_HPARAMS = {
  llama: { blocks: 1, ctx: 256, embd: 64, ffn: 128, heads: 4, epsKey: 'attention.layer_norm_rms_epsilon' },
  gpt2: { blocks: 12, ctx: 1024, embd: 768, ffn: 3072, heads: 12, epsKey: 'attention.layer_norm_epsilon' },
} as const;

/**
 * Writes a vocabulary-only GGUF (no tensors; llama.cpp loads it with vocabOnly) at `out`
 * unless one is there: a minimal `arch` header, then the `tokenizer.*` entries. Written under
 * a temporary name and renamed, so test files running in parallel never read half a file.
 */
export async function writeVocabOnlyGguf(out: string, arch: keyof typeof VOCAB_ONLY_HPARAMS, name: string, tokenizer: MetadataEntry[]): Promise<string> {
  if (existsSync(out)) return out;
  const { writeGgufFile } = await import('../src/gguf/writer.ts');
  const hp = VOCAB_ONLY_HPARAMS[arch];
  mkdirSync(dirname(out), { recursive: true });
  const tmp = `${out}.tmp-${process.pid}`;
  await writeGgufFile(tmp, {
    metadata: [
      { key: 'general.architecture', type: 'string', value: arch },
      { key: 'general.name', type: 'string', value: name },
      { key: `${arch}.block_count`, type: 'uint32', value: hp.blocks },
      { key: `${arch}.context_length`, type: 'uint32', value: hp.ctx },
      { key: `${arch}.embedding_length`, type: 'uint32', value: hp.embd },
      { key: `${arch}.feed_forward_length`, type: 'uint32', value: hp.ffn },
      { key: `${arch}.attention.head_count`, type: 'uint32', value: hp.heads },
      { key: `${arch}.${hp.epsKey}`, type: 'float32', value: 1e-5 },
      ...tokenizer,
    ],
    tensors: [],
  });
  // another test process may have finished first; either copy is the same
  if (!existsSync(out)) renameSync(tmp, out);
  else rmSync(tmp, { force: true });
  return out;
}

/**
 * A vocabulary-only GGUF made from llama.cpp's gpt-2 vocabulary with another
 * `tokenizer.ggml.pre`, so pre-tokenizers without a fixture of their own (e.g. `default`)
 * can still be compared with llama.cpp on real merges.
 */
export async function gpt2VocabWithPre(pre: string): Promise<string> {
  const out = join(REPO_ROOT, '.cache', 'tokenizer', `gpt-2-pre-${pre}.gguf`);
  if (existsSync(out)) return out;
  const { gguf } = await import('@huggingface/gguf');
  const { metadata } = await gguf(vocabPath('gpt-2'), { allowLocalFile: true });
  const m = metadata as unknown as Record<string, unknown>;
  return writeVocabOnlyGguf(out, 'gpt2', `gpt-2 with pre ${pre}`, [
    { key: 'tokenizer.ggml.model', type: 'string', value: 'gpt2' },
    { key: 'tokenizer.ggml.pre', type: 'string', value: pre },
    { key: 'tokenizer.ggml.tokens', type: 'array', itemType: 'string', value: m['tokenizer.ggml.tokens'] as string[] },
    { key: 'tokenizer.ggml.token_type', type: 'array', itemType: 'int32', value: m['tokenizer.ggml.token_type'] as number[] },
    { key: 'tokenizer.ggml.merges', type: 'array', itemType: 'string', value: m['tokenizer.ggml.merges'] as string[] },
    { key: 'tokenizer.ggml.bos_token_id', type: 'uint32', value: 50256 },
    { key: 'tokenizer.ggml.eos_token_id', type: 'uint32', value: 50256 },
  ]);
}
