import { describe, expect, it } from 'vitest';
import { runCli } from './support/cli.ts';

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
});
