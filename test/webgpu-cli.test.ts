// `gguf-mesh generate --backend webgpu` through the real binary (Dawn in the CLI process,
// SwiftShader here): the same greedy tokens as the CPU reference, whole or as a chain of stages.
import { describe, expect, it } from 'vitest';
import { runCli } from './support/cli.ts';
import { STORIES_CONTINUATION_PREFIX, stories260K } from './support/models.ts';

async function generate(args: string[]): Promise<{ tokens: number[]; text: string }> {
  const r = await runCli(['generate', '--model', await stories260K(), '--prompt', 'Once upon a time', '--n', '32', '--json', ...args]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as { tokens: number[]; text: string };
}

describe('gguf-mesh generate --backend webgpu', () => {
  it('continues stories260K as the CPU reference (and llama.cpp) does', async () => {
    const cpu = await generate(['--backend', 'cpu']);
    const gpu = await generate(['--backend', 'webgpu']);
    expect(gpu.tokens).toEqual(cpu.tokens);
    expect(gpu.text.startsWith(STORIES_CONTINUATION_PREFIX.slice(0, 40))).toBe(true);
  });

  it('runs a chain of WebGPU stages with --layers', async () => {
    const cpu = await generate(['--backend', 'cpu']);
    const split = await generate(['--backend', 'webgpu', '--layers', '0-2,2-5']);
    expect(split.tokens).toEqual(cpu.tokens);
  });
});
