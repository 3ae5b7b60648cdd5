// The PyTorch peer's own parts against the oracles, without a room: its dequantisation (numpy,
// peers/torch/gguf_mesh_torch/dequant.py) bit for bit against ggml's to_float on random raw
// blocks and on ggml-quantised data; its layers on synthetic quantised models against
// llama.cpp (greedy tokens, prompt logits), under the rule test/cpu-synthetic.test.ts states
// for ggml-rounded activations; and finding a Python that imports torch.
import { spawn, spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { GgmlType, TYPE_TRAITS, typeName } from '../src/gguf/types.ts';
import { findTorchPython, TORCH_PEER_DIR } from '../src/peer/torch-process.ts';
import { ggmlDequantize, ggmlQuantize } from './support/ggml-ffi.ts';
import { FLIP_BOUND, LlamaModelFfi, maxAbsDiff, oracleGreedy, top2Gap } from './support/llamacpp-oracle.ts';
import { mulberry32 } from './support/prng.ts';
import { expectBitwiseEqual, randomBlocks } from './support/random-blocks.ts';
import { runCli } from './support/cli.ts';
import { syntheticModel } from './support/synthetic.ts';

const TYPES = [GgmlType.F16, GgmlType.BF16, GgmlType.Q4_0, GgmlType.Q4_1, GgmlType.Q5_0, GgmlType.Q5_1, GgmlType.Q8_0, GgmlType.Q2_K, GgmlType.Q3_K, GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K];

/** Runs `python -m gguf_mesh_torch <args>` with `input` on stdin; its stdout bytes. */
let python: string | undefined;

function torchCli(args: string[], input: Uint8Array = new Uint8Array(0)): Promise<Buffer> {
  python ??= findTorchPython().python;
  return new Promise((resolve, reject) => {
    const child = spawn(python!, ['-m', 'gguf_mesh_torch', ...args], { cwd: TORCH_PEER_DIR, stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let err = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => (err += d));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(out)) : reject(new Error(`gguf_mesh_torch ${args[0]} exited ${code}: ${err}`))));
    child.stdin.end(input);
  });
}

async function torchDequant(type: GgmlType, bytes: Uint8Array, n: number): Promise<Float32Array> {
  const out = await torchCli(['dequant', '--type', String(type), '--n', String(n)], bytes);
  return new Float32Array(out.buffer.slice(out.byteOffset, out.byteOffset + out.byteLength));
}

describe('PyTorch peer: dequantisation matches ggml bit for bit', () => {
  it.each(TYPES.map((t) => [typeName(t), t] as const))('%s: random raw blocks and data quantised by ggml', async (_name, type) => {
    const t = TYPE_TRAITS[type]!;
    const n = 4096;
    const raw = randomBlocks(type, n / t.blockSize, 31 + type);
    expectBitwiseEqual(await torchDequant(type, raw, n), ggmlDequantize(type, raw, n), `${typeName(type)} raw`);
    const r = mulberry32(7 + type);
    const x = Float32Array.from({ length: n }, () => (r() - 0.5) * (r() < 0.01 ? 40 : 2));
    const q = ggmlQuantize(type, x, 8, n / 8);
    expectBitwiseEqual(await torchDequant(type, q, n), ggmlDequantize(type, q, n), `${typeName(type)} quantised`);
  });

  it('refuses a type it does not read, naming it', async () => {
    await expect(torchDequant(GgmlType.IQ4_NL, new Uint8Array(18 * 4), 128)).rejects.toThrow(/UNSUPPORTED_TENSOR_TYPE/);
  });
});

describe('PyTorch peer: layers on synthetic quantised models agree with llama.cpp', () => {
  const CASES = [
    ['llama', 'f16'],
    ['llama', 'q8_0'],
    ['qwen2', 'q4_k_m'],
    ['qwen3', 'q6_k'],
    ['qwen2', 'q4_0'],
  ] as const;

  it(`${CASES.map((c) => c.join(' ')).join(', ')}: greedy 24 tokens and prompt logits`, async () => {
    const paths = await Promise.all(CASES.map(([arch, type]) => syntheticModel({ arch, type, layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512 })));
    // one prompt of token ids for every model (their tokenizers differ; ids need no text)
    const prompt = [1, 17, 300, 42, 999, 5, 77, 600, 250, 3, 512, 64];
    const n = 24;
    const lines = (await torchCli(['generate', '--tokens', prompt.join(','), '--n', String(n), '--logits', ...paths.flatMap((p) => ['--model', p])])).toString().trim().split('\n');
    expect(lines).toHaveLength(CASES.length);
    for (const [i, [arch, type]] of CASES.entries()) {
      const ours = JSON.parse(lines[i]!) as { tokens: number[]; logits: number[] };
      const oracle = await LlamaModelFfi.load(paths[i]!);
      try {
        const ref = oracleGreedy(oracle, prompt, n);
        const diff = maxAbsDiff(Float32Array.from(ours.logits), ref.promptLogits);
        const firstDiff = ours.tokens.findIndex((t, k) => t !== ref.tokens[k]);
        console.log(`${arch} ${type}: prompt logits max diff ${diff.toExponential(2)}, greedy ${firstDiff < 0 ? 'identical' : `differs from token ${firstDiff}`}`);
        if (type === 'f16') {
          expect(diff).toBeLessThan(2e-3);
          expect(ours.tokens).toEqual(ref.tokens);
          continue;
        }
        expect(diff).toBeLessThan(FLIP_BOUND);
        if (firstDiff >= 0) {
          // tokens may only part where llama.cpp itself nearly ties
          const ctx = oracle.createContext({ contextLength: prompt.length + firstDiff + 1, flashAttention: false, kvType: 'f32', threads: 1 });
          const there = ctx.decode([...prompt, ...ref.tokens.slice(0, firstDiff)]);
          ctx.dispose();
          expect(top2Gap(there), `${arch} ${type}: tokens differ at ${firstDiff}`).toBeLessThan(2 * FLIP_BOUND);
        }
      } finally {
        oracle.dispose();
      }
    }
  });
});

describe('finding a Python for --backend torch', () => {
  it('takes the first candidate that imports torch and numpy', () => {
    const found = findTorchPython(['/nonexistent/python3', '/usr/bin/python3']);
    expect(found.python).toBe('/usr/bin/python3');
    expect(found.torchVersion).toMatch(/^\d+\.\d+/);
  });

  it('--device cuda runs on a GPU only where torch sees one, and says so where it does not', async () => {
    const probe = spawnSync(findTorchPython().python, ['-c', 'import torch; print(torch.cuda.is_available())'], { encoding: 'utf8' });
    const r = await runCli(['node', '--join', 'http://127.0.0.1:9/room/nowhere#secret=s', '--backend', 'torch', '--device', 'cuda'], { timeoutMs: 60_000 });
    expect(r.code).toBe(1);
    if (probe.stdout.trim() === 'True') expect(r.stderr).toContain('JOIN_FAILED'); // the device is fine; the room is not there
    else expect(r.stderr).toContain('TORCH_UNAVAILABLE: --device cuda: torch sees no CUDA device');
  });

  it('names the Debian packages when none does', () => {
    let err: any;
    try {
      findTorchPython(['/nonexistent/python3']);
    } catch (e) {
      err = e;
    }
    expect(err?.code).toBe('TORCH_UNAVAILABLE');
    expect(err.message).toContain('python3-torch python3-numpy');
    expect(err.message).toContain('/nonexistent/python3');
  });
});
