// `gguf-mesh tokenize` and `gguf-mesh detokenize` through the real binary.
import { beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/cli.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';
import { vocabPath } from './tokenizer-fixtures.ts';

let model: string;
beforeAll(async () => {
  model = await stories260K();
});

describe('gguf-mesh tokenize', () => {
  it('prints {"tokens":[…]} with --json, BOS first as llama.cpp does for generation', async () => {
    const r = await runCli(['tokenize', '--model', model, '--text', 'Once upon a time', '--json']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ tokens: STORIES_PROMPT_TOKENS });
  });

  it('prints one id and token text per line without --json', async () => {
    const r = await runCli(['tokenize', '--model', model, '--text', 'Once upon a time']);
    expect(r.code).toBe(0);
    expect(r.stdout.trim().split('\n')).toEqual(['1\t"<s>"', '403\t"▁Once"', '407\t"▁upon"', '261\t"▁a"', '378\t"▁time"']);
  });

  it('leaves out BOS with --no-add-special and keeps "<s>" literal with --no-parse-special', async () => {
    const r = await runCli(['tokenize', '--model', model, '--text', '<s>', '--json', '--no-add-special', '--no-parse-special']);
    expect(r.code).toBe(0);
    const { tokens } = JSON.parse(r.stdout) as { tokens: number[] };
    expect(tokens).not.toContain(1);
    const parsed = await runCli(['tokenize', '--model', model, '--text', '<s>', '--json', '--no-add-special']);
    expect(JSON.parse(parsed.stdout)).toEqual({ tokens: [1] });
  });

  it('names an unsupported tokenizer and exits 1', async () => {
    const r = await runCli(['tokenize', '--model', vocabPath('bert-bge'), '--text', 'hi']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('TOKENIZER_UNSUPPORTED_MODEL');
    expect(r.stderr).toContain("'bert'");
  });

  it('requires --model and --text (exit 2)', async () => {
    const r = await runCli(['tokenize', '--text', 'x']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--model is required');
  });
});

describe('gguf-mesh detokenize', () => {
  it('prints the text of the tokens, exactly', async () => {
    const r = await runCli(['detokenize', '--model', model, '--tokens', '403,407,261,378']);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe('Once upon a time');
  });

  it('renders control tokens with --special and prints JSON with --json', async () => {
    const r = await runCli(['detokenize', '--model', model, '--tokens', '1,403,2', '--special', '--json']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ text: '<s> Once</s>' });
  });

  it('round-trips what tokenize printed', async () => {
    const text = 'Lily saw a big, red ball! 123 日本 🦙';
    const t = await runCli(['tokenize', '--model', model, '--text', text, '--json', '--no-add-special']);
    const { tokens } = JSON.parse(t.stdout) as { tokens: number[] };
    const d = await runCli(['detokenize', '--model', model, '--tokens', tokens.join(',')]);
    expect(d.stdout).toBe(text);
  });

  it('rejects a malformed list (exit 2) and an id past the vocabulary (exit 1, TOKEN_OUT_OF_RANGE)', async () => {
    const bad = await runCli(['detokenize', '--model', model, '--tokens', '1,two']);
    expect(bad.code).toBe(2);
    const out = await runCli(['detokenize', '--model', model, '--tokens', '1,512']);
    expect(out.code).toBe(1);
    expect(out.stderr).toContain('TOKEN_OUT_OF_RANGE');
  });
});
