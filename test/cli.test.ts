import { describe, expect, it } from 'vitest';
import { runCli } from './support/cli.ts';
import { stories260K } from './support/models.ts';

describe('gguf-mesh CLI', () => {
  it('lists its commands with --help and exits 0', async () => {
    const r = await runCli(['--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('usage: gguf-mesh <command>');
  });

  it('rejects an unknown command with a one-line reason and a non-zero exit', async () => {
    const r = await runCli(['frobnicate']);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain("unknown command 'frobnicate'");
  });

  // generated secrets are base64url: one in 64 starts with '-' (a TURN secret failed a CI run so)
  it("takes a value that starts with '-' as the value, unless it is one of the command's options", async () => {
    const model = await stories260K();
    const dashed = await runCli(['tokenize', '--model', model, '--text', '-Once', '--json']);
    expect(dashed.stderr).toBe('');
    expect(JSON.parse(dashed.stdout).tokens).toEqual(JSON.parse((await runCli(['tokenize', '--model', model, '--text=-Once', '--json'])).stdout).tokens);
    const missing = await runCli(['tokenize', '--model', model, '--text', '--json']);
    expect(missing.code).toBe(2);
    expect(missing.stderr.trim().split('\n')).toHaveLength(1);
    expect(missing.stderr).toMatch(/'--text' argument is ambiguous.*--text=-XYZ/);
  });
});
