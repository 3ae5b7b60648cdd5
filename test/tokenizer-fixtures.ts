// llama.cpp's own tokenizer fixtures, extracted at test time from the git bundle node-llama-cpp
// ships: vocabulary-only GGUFs of real tokenizers with .inp/.out cases, and real chat templates.
// Extracted once into .cache/ (git-ignored); never committed.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
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
