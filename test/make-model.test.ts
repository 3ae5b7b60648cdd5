// `gguf-mesh make-model`: every --type and architecture loads in llama.cpp (node-llama-cpp)
// and generates; tensor names, shapes and types follow llama.cpp; same options → same bytes;
// bad options fail with one line.
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { LlamaModel } from 'node-llama-cpp';
import { afterAll, describe, expect, it } from 'vitest';
import { readHeader } from '../src/gguf/parse.ts';
import { GgmlType } from '../src/gguf/types.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { makeModel, planModel, syntheticModelSpec } from '../src/model/synthetic-model.ts';
import { buildVocab, minVocabSize } from '../src/model/synthetic-vocab.ts';
import { runCli } from './support/cli.ts';
import { greedyGenerate, loadModel, tokenize } from './support/llama.ts';
import { syntheticModel } from './support/synthetic.ts';

const dir = mkdtempSync(join(tmpdir(), 'make-model-'));
const models: LlamaModel[] = [];
afterAll(async () => {
  for (const m of models) await m.dispose();
  rmSync(dir, { recursive: true, force: true });
});

const TINY = ['--layers', '2', '--embd', '256', '--heads', '4', '--ffn', '512', '--vocab', '600'];

async function make(name: string, args: string[]): Promise<string> {
  const out = join(dir, name);
  const r = await runCli(['make-model', '--out', out, ...args]);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  expect(r.stdout).toMatch(/^wrote .*: \d+ bytes, \d+ tensors/);
  return out;
}

/** Loads a model in llama.cpp and greedy-generates a few tokens from a prompt. */
async function generates(path: string, nVocab: number): Promise<number[]> {
  const model = await loadModel(path);
  models.push(model);
  expect(model.fileInsights.totalLayers).toBeGreaterThan(0);
  const prompt = tokenize(model, 'Once upon a time the dog');
  expect(prompt.length).toBeGreaterThan(2);
  const out = await greedyGenerate(model, prompt, 6);
  expect(out).toHaveLength(6);
  for (const t of out) expect(t >= 0 && t < nVocab).toBe(true);
  expect(new Set(out).size, `degenerate continuation ${out.join(',')}`).toBeGreaterThan(1);
  return out;
}

function typesByName(header: Awaited<ReturnType<typeof readHeader>>): Map<string, GgmlType> {
  return new Map(header.tensors.map((t) => [t.name, t.type]));
}

describe('make-model --type', () => {
  const expected: Record<string, { matrix: GgmlType; fileType: number }> = {
    f32: { matrix: GgmlType.F32, fileType: 0 },
    f16: { matrix: GgmlType.F16, fileType: 1 },
    q8_0: { matrix: GgmlType.Q8_0, fileType: 7 },
    q4_0: { matrix: GgmlType.Q4_0, fileType: 2 },
    q4_k: { matrix: GgmlType.Q4_K, fileType: 14 },
    q6_k: { matrix: GgmlType.Q6_K, fileType: 18 },
    bf16: { matrix: GgmlType.BF16, fileType: 32 },
    q4_1: { matrix: GgmlType.Q4_1, fileType: 3 },
    q5_0: { matrix: GgmlType.Q5_0, fileType: 8 },
    q5_1: { matrix: GgmlType.Q5_1, fileType: 9 },
    q2_k: { matrix: GgmlType.Q2_K, fileType: 10 },
    q3_k: { matrix: GgmlType.Q3_K, fileType: 12 },
    q5_k: { matrix: GgmlType.Q5_K, fileType: 16 },
    iq4_nl: { matrix: GgmlType.IQ4_NL, fileType: 25 },
    iq4_xs: { matrix: GgmlType.IQ4_XS, fileType: 30 },
    mxfp4: { matrix: GgmlType.MXFP4, fileType: 38 },
  };
  for (const [type, want] of Object.entries(expected)) {
    it(`${type}: every matrix is ${GgmlType[want.matrix]}, norms stay F32, llama.cpp loads it and generates`, async () => {
      const path = await make(`${type}.gguf`, [...TINY, '--type', type]);
      const header = await readHeader(path);
      expect(header.metadata['general.file_type']).toBe(want.fileType);
      for (const t of header.tensors) {
        expect(t.type, t.name).toBe(t.shape.length === 1 ? GgmlType.F32 : want.matrix);
      }
      await generates(path, 600);
    });
  }

  it("q4_k_m: Q4_K with output and llama.cpp's use_more_bits layers' attn_v/ffn_down in Q6_K; loads and generates", async () => {
    const path = await make('q4_k_m.gguf', [...TINY, '--type', 'q4_k_m']);
    const header = await readHeader(path);
    expect(header.metadata['general.file_type']).toBe(15);
    const types = typesByName(header);
    // 2 layers: use_more_bits(i, 2) is true for i >= 7*2/8 = 1 only
    expect(types.get('output.weight')).toBe(GgmlType.Q6_K);
    expect(types.get('token_embd.weight')).toBe(GgmlType.Q4_K);
    expect(types.get('blk.0.attn_v.weight')).toBe(GgmlType.Q4_K);
    expect(types.get('blk.0.ffn_down.weight')).toBe(GgmlType.Q4_K);
    expect(types.get('blk.1.attn_v.weight')).toBe(GgmlType.Q6_K);
    expect(types.get('blk.1.ffn_down.weight')).toBe(GgmlType.Q6_K);
    expect(types.get('blk.1.attn_q.weight')).toBe(GgmlType.Q4_K);
    expect(types.get('blk.1.attn_norm.weight')).toBe(GgmlType.F32);
    await generates(path, 600);
  });

  it('q4_k_m over 8 layers picks Q6_K for layers 0, 3, 6 and 7 (as llama-quantize would)', () => {
    const spec = syntheticModelSpec({ layers: 8, type: 'q4_k_m', headerOnly: true });
    const q6 = (role: string) =>
      spec.tensors.filter((t) => t.name.endsWith(`${role}.weight`) && t.type === GgmlType.Q6_K).map((t) => Number(t.name.split('.')[1]));
    expect(q6('attn_v')).toEqual([0, 3, 6, 7]);
    expect(q6('ffn_down')).toEqual([0, 3, 6, 7]);
    expect(q6('ffn_up')).toEqual([]);
  });
});

describe('make-model --arch', () => {
  it('llama with GQA: llama.cpp tensor names and shapes, metadata, generation', async () => {
    const path = await make('llama-gqa.gguf', [...TINY, '--kv-heads', '2', '--type', 'q8_0']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('token_embd.weight')).toEqual([256, 600]);
    expect(shapes.get('blk.0.attn_q.weight')).toEqual([256, 256]);
    expect(shapes.get('blk.0.attn_k.weight')).toEqual([256, 128]);
    expect(shapes.get('blk.0.attn_v.weight')).toEqual([256, 128]);
    expect(shapes.get('blk.0.attn_output.weight')).toEqual([256, 256]);
    expect(shapes.get('blk.1.ffn_gate.weight')).toEqual([256, 512]);
    expect(shapes.get('blk.1.ffn_up.weight')).toEqual([256, 512]);
    expect(shapes.get('blk.1.ffn_down.weight')).toEqual([512, 256]);
    expect(shapes.get('output_norm.weight')).toEqual([256]);
    expect(shapes.get('output.weight')).toEqual([256, 600]);
    expect(header.tensors).toHaveLength(2 + 2 * 9 + 1);
    const m = header.metadata;
    expect(m['general.architecture']).toBe('llama');
    expect(m['llama.block_count']).toBe(2);
    expect(m['llama.attention.head_count']).toBe(4);
    expect(m['llama.attention.head_count_kv']).toBe(2);
    expect(m['llama.rope.freq_base']).toBe(10000);
    expect(m['llama.attention.layer_norm_rms_epsilon']).toBeCloseTo(1e-5, 10);
    expect(m['tokenizer.ggml.model']).toBe('llama');
    await generates(path, 600);
  });

  it('qwen2 with GQA: q/k/v biases, gpt2 tokenizer with the qwen2 pre-tokenizer, generation', async () => {
    const path = await make('qwen2.gguf', [...TINY, '--arch', 'qwen2', '--kv-heads', '1', '--type', 'f16']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.attn_q.bias')).toEqual([256]);
    expect(shapes.get('blk.0.attn_k.bias')).toEqual([64]);
    expect(shapes.get('blk.1.attn_v.bias')).toEqual([64]);
    expect(typesByName(header).get('blk.0.attn_q.bias')).toBe(GgmlType.F32);
    expect(header.metadata['general.architecture']).toBe('qwen2');
    expect(header.metadata['qwen2.attention.head_count_kv']).toBe(1);
    expect(header.metadata['tokenizer.ggml.model']).toBe('gpt2');
    expect(header.metadata['tokenizer.ggml.pre']).toBe('qwen2');
    await generates(path, 600);
  });

  it('qwen3 with GQA: per-head q/k norms, no biases, generation', async () => {
    const path = await make('qwen3.gguf', [...TINY, '--arch', 'qwen3', '--kv-heads', '2', '--type', 'q4_k_m']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.attn_q_norm.weight')).toEqual([64]);
    expect(shapes.get('blk.1.attn_k_norm.weight')).toEqual([64]);
    expect(shapes.has('blk.0.attn_q.bias')).toBe(false);
    expect(header.metadata['qwen3.attention.key_length']).toBe(64);
    await generates(path, 600);
  });

  it('qwen3moe: router, 3-D expert tensors, q/k norms, expert metadata; generation', async () => {
    const path = await make('qwen3moe.gguf', [...TINY, '--arch', 'qwen3moe', '--kv-heads', '2', '--experts', '4', '--experts-used', '2', '--expert-ffn', '256', '--type', 'q4_k_m']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    const types = typesByName(header);
    expect(shapes.get('blk.0.ffn_gate_inp.weight')).toEqual([256, 4]);
    expect(types.get('blk.0.ffn_gate_inp.weight')).toBe(GgmlType.F32); // llama-quantize keeps routers F32
    expect(shapes.get('blk.0.ffn_gate_exps.weight')).toEqual([256, 256, 4]);
    expect(shapes.get('blk.1.ffn_up_exps.weight')).toEqual([256, 256, 4]);
    expect(shapes.get('blk.1.ffn_down_exps.weight')).toEqual([256, 256, 4]);
    expect(types.get('blk.1.ffn_down_exps.weight')).toBe(GgmlType.Q6_K);
    expect(shapes.has('blk.0.ffn_gate.weight')).toBe(false);
    expect(shapes.get('blk.0.attn_q_norm.weight')).toEqual([64]);
    expect(header.metadata['qwen3moe.expert_count']).toBe(4);
    expect(header.metadata['qwen3moe.expert_used_count']).toBe(2);
    expect(header.metadata['qwen3moe.expert_feed_forward_length']).toBe(256);
    await generates(path, 600);
  });

  it('qwen35moe: DeltaNet blocks, a gated full-attention block every 4th, experts + shared expert, qwen35 tokenizer; generation', async () => {
    const path = await make('qwen35moe.gguf', [
      '--layers', '4', '--embd', '256', '--heads', '4', '--ffn', '512', '--vocab', '600', '--arch', 'qwen35moe', '--kv-heads', '2',
      '--expert-ffn', '256', '--shared-ffn', '256', '--linear-k-heads', '2', '--linear-v-heads', '8', '--linear-head-dim', '32', '--type', 'q4_k_m',
    ]);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.attn_qkv.weight')).toEqual([256, 2 * 2 * 32 + 8 * 32]);
    expect(shapes.get('blk.0.ssm_conv1d.weight')).toEqual([4, 384]);
    expect(shapes.get('blk.2.ssm_out.weight')).toEqual([256, 256]);
    expect(shapes.has('blk.2.attn_q.weight')).toBe(false);
    expect(shapes.get('blk.3.attn_q.weight')).toEqual([256, 2 * 4 * 64]); // query and gate per head
    expect(shapes.get('blk.3.ffn_gate_inp_shexp.weight')).toEqual([256]);
    expect(header.metadata['qwen35moe.rope.dimension_count']).toBe(16);
    expect(header.metadata['qwen35moe.rope.dimension_sections']).toEqual([3, 3, 2, 0]);
    expect(header.metadata['qwen35moe.ssm.inner_size']).toBe(256);
    expect(header.metadata['tokenizer.ggml.pre']).toBe('qwen35');
    await generates(path, 600);
  });

  it('qwen35moe --header-only at Qwen3.5-35B-A3B\'s shapes: the audit reads the real figures', async () => {
    const path = await make('qwen35-35b-header.gguf', [
      '--arch', 'qwen35moe', '--layers', '40', '--embd', '2048', '--heads', '16', '--kv-heads', '2', '--head-dim', '256', '--experts', '256',
      '--experts-used', '8', '--expert-ffn', '512', '--shared-ffn', '512', '--linear-k-heads', '16', '--linear-v-heads', '32', '--linear-head-dim', '128',
      '--vocab', '248320', '--ctx', '262144', '--type', 'q4_k', '--header-only',
    ]);
    const r = await runCli(['audit', path, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const a = JSON.parse(r.stdout);
    expect(a.kv_bytes_per_token).toBe(20_480);
    expect(a.fixed_state_bytes).toBe(30 * 2_195_456);
    expect(a.hop_bytes_per_token).toBe(4096);
    expect(a.layer_bytes[0]).toBe(476_406_528);
    expect(a.backends.cpu.missing_ops).toEqual([]);
  });

  it('qwen2moe: experts plus the shared expert and its gate, q/k/v biases; generation', async () => {
    const path = await make('qwen2moe.gguf', [...TINY, '--arch', 'qwen2moe', '--expert-ffn', '128', '--shared-ffn', '384', '--experts', '8', '--experts-used', '3']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.ffn_gate_exps.weight')).toEqual([256, 128, 8]);
    expect(shapes.get('blk.0.ffn_gate_inp_shexp.weight')).toEqual([256]);
    expect(shapes.get('blk.0.ffn_gate_shexp.weight')).toEqual([256, 384]);
    expect(shapes.get('blk.0.ffn_down_shexp.weight')).toEqual([384, 256]);
    expect(shapes.get('blk.0.attn_q.bias')).toEqual([256]);
    expect(header.metadata['qwen2moe.expert_shared_feed_forward_length']).toBe(384);
    await generates(path, 600);
  });

  it('gemma3: post-norms, q/k norms, sliding-window metadata, SentencePiece vocabulary; generation', async () => {
    const path = await make('gemma3.gguf', [...TINY, '--arch', 'gemma3', '--kv-heads', '2', '--sliding-window', '8', '--swa-pattern', '2']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.post_attention_norm.weight')).toEqual([256]);
    expect(shapes.get('blk.1.post_ffw_norm.weight')).toEqual([256]);
    expect(shapes.get('blk.0.attn_k_norm.weight')).toEqual([64]);
    expect(header.metadata['gemma3.attention.sliding_window']).toBe(8);
    expect(header.metadata['gemma3.attention.sliding_window_pattern']).toBe(2);
    expect(header.metadata['gemma3.rope.freq_base_swa']).toBe(10000);
    expect(header.metadata['tokenizer.ggml.model']).toBe('llama');
    await generates(path, 600);
  });

  it('phi3: fused attn_qkv and gate/up, LongRoPE factor tables; generation', async () => {
    const path = await make('phi3.gguf', [...TINY, '--arch', 'phi3', '--kv-heads', '2', '--rope-orig-ctx', '64']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.attn_qkv.weight')).toEqual([256, 256 + 2 * 128]);
    expect(shapes.get('blk.0.ffn_up.weight')).toEqual([256, 1024]);
    expect(shapes.has('blk.0.ffn_gate.weight')).toBe(false);
    expect(shapes.get('rope_factors_long.weight')).toEqual([32]);
    expect(shapes.get('rope_factors_short.weight')).toEqual([32]);
    expect(header.metadata['phi3.rope.scaling.original_context_length']).toBe(64);
    await generates(path, 600);
  });

  it('--rope-scaling yarn and --rope-freqs write the keys and tensor llama.cpp reads; generation', async () => {
    const yarn = await make('yarn.gguf', [...TINY, '--arch', 'qwen3', '--rope-scaling', 'yarn', '--rope-factor', '4', '--rope-orig-ctx', '64']);
    const h = await readHeader(yarn);
    expect(h.metadata['qwen3.rope.scaling.type']).toBe('yarn');
    expect(h.metadata['qwen3.rope.scaling.factor']).toBe(4);
    await generates(yarn, 600);
    const llama3 = await make('llama3.gguf', [...TINY, '--rope-freqs']);
    expect((await readHeader(llama3)).tensors.find((t) => t.name === 'rope_freqs.weight')?.shape).toEqual([32]);
    await generates(llama3, 600);
  });

  it('llama with the gpt2 (llama-bpe) tokenizer loads and generates', async () => {
    const path = await make('llama-bpe.gguf', [...TINY, '--tokenizer', 'gpt2']);
    const header = await readHeader(path);
    expect(header.metadata['tokenizer.ggml.pre']).toBe('llama-bpe');
    await generates(path, 600);
  });
});

describe('make-model tokenizers', () => {
  it('learn real words from the corpus, so llama.cpp tokenises English into few tokens', async () => {
    for (const [kind, pre] of [['llama', undefined], ['gpt2', 'llama-bpe'], ['gpt2', 'qwen2'], ['gpt2', 'gpt-2']] as const) {
      const path = await syntheticModel({ vocab: 1024, tokenizer: kind, ...(kind === 'gpt2' ? { pre, arch: pre === 'qwen2' ? 'qwen2' : 'llama' } : {}) });
      const model = await loadModel(path, { vocabOnly: true });
      models.push(model);
      const text = 'Once upon a time there was a little girl. She loved the boats and the sea.';
      const tokens = [...model.tokenize(text, false)];
      expect(tokens.length, `${kind}/${pre}`).toBeLessThan(text.length / 2.5);
      expect(model.detokenize(tokens)).toContain('upon a time there was a little girl');
      // chat markers are single control tokens, so a chat template's output tokenises cleanly
      const chat = [...model.tokenize('<|im_start|>user\nhi<|im_end|>', true)];
      expect(model.detokenize([chat[0]!], true)).toBe('<|im_start|>');
      expect(model.detokenize([chat.at(-1)!], true)).toBe('<|im_end|>');
      expect(model.isSpecialToken(chat[0]!)).toBe(true);
      expect(model.isEogToken(chat.at(-1)!)).toBe(true);
    }
  });

  it('fills --vocab exactly and refuses a vocabulary below the base tokens with the minimum named', () => {
    for (const kind of ['llama', 'gpt2'] as const) {
      const min = minVocabSize(kind);
      expect(buildVocab({ kind, vocabSize: min }).tokens).toHaveLength(min);
      expect(buildVocab({ kind, vocabSize: 5000 }).tokens).toHaveLength(5000);
      expect(new Set(buildVocab({ kind, vocabSize: 5000 }).tokens).size).toBe(5000);
      expect(() => buildVocab({ kind, vocabSize: min - 1 })).toThrow(new RegExp(`at least ${min}`));
    }
    const spm = buildVocab({ kind: 'llama', vocabSize: 600 });
    expect(spm.tokens.slice(0, 4)).toEqual(['<unk>', '<s>', '</s>', '<0x00>']);
    expect(spm.tokens[3 + 255]).toBe('<0xFF>');
    expect(spm.tokens).toContain('▁the');
  });
});

describe('make-model determinism and errors', () => {
  it('same options and seed give the same bytes (CLI and in-process); another seed differs', async () => {
    const args = [...TINY, '--type', 'q4_k', '--seed', '7'];
    const a = await make('det-a.gguf', args);
    const b = await make('det-b.gguf', args);
    const c = await make('det-c.gguf', [...TINY, '--type', 'q4_k', '--seed', '8']);
    const hash = (p: string) => createHash('sha256').update(readFileSync(p)).digest('hex');
    expect(hash(a)).toBe(hash(b));
    expect(hash(c)).not.toBe(hash(a));
    const opts: MakeModelOptions = { layers: 2, embd: 256, heads: 4, ffn: 512, vocab: 600, type: 'q4_k', seed: 7 };
    expect(createHash('sha256').update(makeModel(opts)).digest('hex')).toBe(hash(a));
    expect(planModel(opts).fileBytes).toBe(statSync(a).size);
  });

  it('--header-only writes only the header of a large model', async () => {
    const path = await make('big-header.gguf', ['--layers', '80', '--embd', '8192', '--heads', '64', '--kv-heads', '8', '--ffn', '28672', '--vocab', '32000', '--type', 'q4_k_m', '--header-only']);
    expect(statSync(path).size).toBeLessThan(2_000_000);
    const header = await readHeader(path, { allowTruncatedData: true });
    expect(header.tensors).toHaveLength(2 + 80 * 9 + 1);
    const last = header.tensors.at(-1)!;
    expect(last.offset + last.byteLength).toBeGreaterThan(30e9);
  });

  const bad: [string, string[], RegExp][] = [
    ['missing --out', ['make-model'], /--out is required/],
    ['unknown arch', ['make-model', '--out', 'x.gguf', '--arch', 'gpt5'], /--arch must be one of llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, phi3/],
    ['unknown type', ['make-model', '--out', 'x.gguf', '--type', 'iq2_xxs'], /--type must be one of/],
    ['more experts used than exist', ['make-model', '--out', 'x.gguf', '--arch', 'qwen3moe', '--experts', '2', '--experts-used', '3'], /experts-used 3 exceeds experts 2/],
    ['tied qwen2moe', ['make-model', '--out', 'x.gguf', '--arch', 'qwen2moe', '--tied'], /qwen2moe cannot tie its output head/],
    ['unknown rope scaling', ['make-model', '--out', 'x.gguf', '--rope-scaling', 'ntk'], /--rope-scaling must be one of none, linear, yarn/],
    ['non-integer', ['make-model', '--out', 'x.gguf', '--layers', 'two'], /--layers must be an integer/],
    ['heads not dividing embd', ['make-model', '--out', 'x.gguf', '--embd', '256', '--heads', '3'], /not divisible by heads 3/],
    ['kv-heads not dividing heads', ['make-model', '--out', 'x.gguf', '--heads', '4', '--kv-heads', '3'], /multiple of kv-heads 3/],
    ['vocab too small', ['make-model', '--out', 'x.gguf', '--vocab', '100'], /vocab 100 is too small .* at least \d+/],
    ['K-quant row length', ['make-model', '--out', 'x.gguf', '--embd', '128', '--type', 'q4_k'], /rows of 128 values.*multiple of 256/],
    ['zero layers', ['make-model', '--out', 'x.gguf', '--layers', '0'], /layers must be a positive integer/],
    ['qwen2 head size', ['make-model', '--out', 'x.gguf', '--arch', 'qwen2', '--head-dim', '32'], /qwen2 needs heads × head-dim = embd/],
    ['odd head size', ['make-model', '--out', 'x.gguf', '--head-dim', '33'], /head size 33 must be even/],
    ['pre without gpt2', ['make-model', '--out', 'x.gguf', '--pre', 'qwen2'], /--pre applies to the gpt2 tokenizer only/],
    ['unknown option', ['make-model', '--out', 'x.gguf', '--bogus', '1'], /bogus/],
  ];
  // each case is a process of its own: run them side by side
  for (const [what, args, reason] of bad) {
    it.concurrent(`exits non-zero with one line for ${what}`, async ({ expect }) => {
      const r = await runCli(args.map((a) => (a === 'x.gguf' ? join(dir, 'never.gguf') : a)));
      expect(r.code).not.toBe(0);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(reason);
      expect(() => statSync(join(dir, 'never.gguf'))).toThrow();
    });
  }
});

describe('make-model variants of real small models', () => {
  it('qwen3 with a head size other than embd/heads (as Qwen3 has) loads and generates', async () => {
    const path = await make('qwen3-hd.gguf', [...TINY, '--arch', 'qwen3', '--heads', '4', '--kv-heads', '2', '--head-dim', '128', '--type', 'q8_0']);
    const header = await readHeader(path);
    const shapes = new Map(header.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('blk.0.attn_q.weight')).toEqual([256, 512]);
    expect(shapes.get('blk.0.attn_k.weight')).toEqual([256, 256]);
    expect(shapes.get('blk.0.attn_output.weight')).toEqual([512, 256]);
    expect(shapes.get('blk.0.attn_q_norm.weight')).toEqual([128]);
    expect(header.metadata['qwen3.attention.key_length']).toBe(128);
    expect(header.metadata['qwen3.rope.dimension_count']).toBe(128);
    await generates(path, 600);
  });

  it('--tied drops output.weight (llama.cpp uses token_embd as the head); q4_k_m gives it Q6_K', async () => {
    const path = await make('tied.gguf', [...TINY, '--tied', '--type', 'q4_k_m']);
    const header = await readHeader(path);
    const types = typesByName(header);
    expect(types.has('output.weight')).toBe(false);
    expect(types.get('token_embd.weight')).toBe(GgmlType.Q6_K);
    await generates(path, 600);
  });
});
