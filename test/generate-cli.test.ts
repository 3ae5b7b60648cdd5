// `gguf-mesh generate` through the real binary: the --json document, the DESIGN continuation,
// split chains, the llama.cpp backend, seeded sampling, URLs and usage errors.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/cli.ts';
import { STORIES_CONTINUATION_PREFIX, STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';
import { startRangeServer } from './support/range-server.ts';
import type { RangeServer } from './support/range-server.ts';

let model: string;
let server: RangeServer;

beforeAll(async () => {
  model = await stories260K();
  server = await startRangeServer();
  server.set('/stories260K.gguf', new Uint8Array(readFileSync(model)));
});
afterAll(async () => {
  await server?.close();
});

interface GenerateJson {
  prompt_tokens: number[];
  tokens: number[];
  text: string;
  timings: { prompt_ms: number; decode_ms: number; prompt_tok_s: number; decode_tok_s: number };
}

async function generateJson(args: string[]): Promise<GenerateJson> {
  const r = await runCli(['generate', '--json', ...args]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  return JSON.parse(r.stdout) as GenerateJson;
}

describe('gguf-mesh generate', () => {
  it('--json prints prompt_tokens, tokens, text and timings; greedy continues as llama.cpp does', async () => {
    const out = await generateJson(['--model', model, '--prompt', 'Once upon a time', '--n', '32']);
    expect(Object.keys(out)).toEqual(['prompt_tokens', 'tokens', 'text', 'timings']);
    expect(Object.keys(out.timings)).toEqual(['prompt_ms', 'decode_ms', 'prompt_tok_s', 'decode_tok_s']);
    expect(out.prompt_tokens).toEqual(STORIES_PROMPT_TOKENS);
    expect(out.tokens).toHaveLength(32);
    expect(out.text.startsWith(STORIES_CONTINUATION_PREFIX.slice(0, 40))).toBe(true);
    expect(out.timings.prompt_tok_s).toBeGreaterThan(0);
    expect(out.timings.decode_tok_s).toBeGreaterThan(0);

    const split = await generateJson(['--model', model, '--prompt', 'Once upon a time', '--n', '32', '--layers', '0-2,2-5']);
    expect(split.tokens).toEqual(out.tokens);
    expect(split.text).toBe(out.text);

    const llama = await generateJson(['--model', model, '--prompt', 'Once upon a time', '--n', '32', '--backend', 'llamacpp', '--threads', '1']);
    expect(llama.prompt_tokens).toEqual(out.prompt_tokens);
    expect(llama.tokens).toEqual(out.tokens);
    expect(llama.text).toBe(out.text);

    // llama.cpp as a chain of layer ranges (shard GGUFs) in this process
    const llamaSplit = await generateJson(['--model', model, '--prompt', 'Once upon a time', '--n', '32', '--backend', 'llamacpp', '--threads', '1', '--layers', '0-2,2-5']);
    expect(llamaSplit.tokens).toEqual(out.tokens);
  });

  it('streams text without --json and reads a model from a URL by Range requests', async () => {
    const r = await runCli(['generate', '--model', `${server.url}/stories260K.gguf`, '--prompt', 'Once upon a time', '--n', '24']);
    expect(r.code).toBe(0);
    expect(r.stdout.startsWith(STORIES_CONTINUATION_PREFIX.slice(0, 30))).toBe(true);
    expect(r.stderr).toMatch(/prompt: 5 tokens .* generated \d+ tokens/);
    expect(server.requests.some((q) => q.range !== undefined)).toBe(true);
  });

  it('sampling is deterministic for a seed; stop strings cut the text', async () => {
    const args = ['--model', model, '--prompt', 'Once upon a time', '--n', '40', '--temperature', '0.9', '--top-k', '40', '--top-p', '0.95', '--min-p', '0.02', '--repeat-penalty', '1.1'];
    const a = await generateJson([...args, '--seed', '11']);
    const b = await generateJson([...args, '--seed', '11']);
    const c = await generateJson([...args, '--seed', '12']);
    expect(a.tokens).toEqual(b.tokens);
    expect(c.tokens).not.toEqual(a.tokens);
    const stopped = await generateJson(['--model', model, '--prompt', 'Once upon a time', '--n', '64', '--stop', 'Lily']);
    expect(stopped.text).toBe(', there was a little girl named ');
  });

  it('usage and model errors exit non-zero with a one-line reason', async () => {
    const bad = await runCli(['generate', '--model', model, '--prompt', 'x', '--backend', 'gpu']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--backend');
    const missing = await runCli(['generate', '--model', model]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('--prompt');
    const gap = await runCli(['generate', '--model', model, '--prompt', 'x', '--layers', '0-2,3-5']);
    expect(gap.code).toBe(1);
    expect(gap.stderr).toContain('BAD_SHARD');
    const layersLlama = await runCli(['generate', '--model', model, '--prompt', 'x', '--backend', 'llamacpp', '--layers', '0-2,3-5']);
    expect(layersLlama.code).toBe(1);
    expect(layersLlama.stderr).toContain('BAD_SHARD');
  });
});
