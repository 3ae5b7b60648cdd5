// Run as a child process by gguf-corpus.test.ts: loads each GGUF named on stdin with
// node-llama-cpp (llama.cpp itself) and prints one JSON line per file — whether llama.cpp
// accepts it and, when asked, its greedy tokens for a prompt. A child, because llama.cpp may
// abort the process on a file it cannot handle: the parent notes it and starts the next one.
import { createInterface } from 'node:readline';
import { greedyGenerate, loadModel, tokenize } from '../support/llama.ts';

const PROMPT = 'Once upon a time';

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const { file, generate } = JSON.parse(line) as { file: string; generate: boolean };
  let out: Record<string, unknown>;
  try {
    const model = await loadModel(file);
    try {
      out = { file, loaded: true, ...(generate ? { prompt: tokenize(model, PROMPT), tokens: await greedyGenerate(model, PROMPT, 8) } : {}) };
    } finally {
      await model.dispose();
    }
  } catch (e) {
    out = { file, loaded: false, error: (e as Error).message.slice(0, 200) };
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
}
