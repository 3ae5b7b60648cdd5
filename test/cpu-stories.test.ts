// The CPU reference engine and the llama.cpp backend on a real model (stories260K), against
// llama.cpp itself: greedy continuations, logits, per-layer hidden states, split chains,
// KV bookkeeping and the session errors.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import { shardTensors } from '../src/backends/shard.ts';
import type { ShardRange, StageBackend } from '../src/backends/types.ts';
import { isMeshError } from '../src/errors.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { GgmlType } from '../src/gguf/types.ts';
import type { TensorInfo, TensorSource } from '../src/gguf/types.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { InProcessChain, generate } from '../src/route/generation.ts';
import { StepperGenerator } from '../src/route/generation-loop.ts';
import type { StageChain } from '../src/route/generation.ts';
import { LlamaModelFfi, argmax, maxAbsDiff, oracleGreedy, oracleHidden } from './support/llamacpp-oracle.ts';
import { STORIES_CONTINUATION_PREFIX, STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';

const PROMPTS = ['Once upon a time', 'Lily and Tom went to the park', 'The little dog was sad because', 'One day, a girl named Sue', 'Mom said'];
const N = 64;
const N_LAYER = 5;

let path: string;
let source: TensorSource;
let tokenizer: Tokenizer;
let oracle: LlamaModelFfi;
const toDispose: { dispose(): Promise<void> | void }[] = [];

beforeAll(async () => {
  path = await stories260K();
  source = await openTensorSource(path);
  tokenizer = Tokenizer.fromMetadata(source.header.metadata);
  oracle = await LlamaModelFfi.load(path);
});

afterAll(async () => {
  for (const d of toDispose) await d.dispose();
  oracle?.dispose();
  await source?.close();
});

async function cpuStages(ranges: ShardRange[]): Promise<CpuBackend[]> {
  const stages: CpuBackend[] = [];
  for (const r of ranges) {
    const b = new CpuBackend();
    await b.load(source, r);
    stages.push(b);
    toDispose.push(b);
  }
  return stages;
}

/** n greedy tokens through a chain, never stopping at EOS; also every step's logits */
async function chainGreedy(chain: StageChain, prompt: number[], n: number, sessionId = 's'): Promise<{ tokens: number[]; logits: Float32Array[] }> {
  await chain.openSession(sessionId, prompt.length + n);
  try {
    let logits = await chain.forward(sessionId, Int32Array.from(prompt), 0);
    const all = [logits];
    const tokens: number[] = [];
    for (let i = 0; i < n; i++) {
      const t = argmax(logits);
      tokens.push(t);
      if (i + 1 < n) {
        logits = await chain.forward(sessionId, Int32Array.of(t), prompt.length + i);
        all.push(logits);
      }
    }
    return { tokens, logits: all };
  } finally {
    await chain.releaseSession(sessionId);
  }
}

describe('stories260K: CPU engine and llama.cpp backends agree with llama.cpp', () => {
  it('tokenises the DESIGN prompt as llama.cpp does', () => {
    expect(tokenizer.encode('Once upon a time')).toEqual(STORIES_PROMPT_TOKENS);
    expect(oracle.tokenize('Once upon a time')).toEqual(STORIES_PROMPT_TOKENS);
  });

  it('CPU engine: greedy 64 tokens from 5 prompts are llama.cpp\'s, logits within 1e-4', async () => {
    const chain = new InProcessChain(await cpuStages([{ start: 0, end: N_LAYER }]));
    for (const prompt of PROMPTS) {
      const tokens = tokenizer.encode(prompt);
      expect(tokens).toEqual(oracle.tokenize(prompt));
      const ref = oracleGreedy(oracle, tokens, N);
      const ours = await chainGreedy(chain, tokens, N);
      expect(ours.tokens, prompt).toEqual(ref.tokens);
      expect(maxAbsDiff(ours.logits[0]!, ref.promptLogits), prompt).toBeLessThan(1e-4);
    }
  });

  it('continues "Once upon a time" with the DESIGN continuation, streaming the same text', async () => {
    const chain = new InProcessChain(await cpuStages([{ start: 0, end: N_LAYER }]));
    let streamed = '';
    const r = await generate(chain, tokenizer, { promptTokens: STORIES_PROMPT_TOKENS, maxTokens: N, onDelta: (d) => (streamed += d) });
    expect(r.text.startsWith(STORIES_CONTINUATION_PREFIX)).toBe(true);
    expect(streamed).toBe(r.text);
    expect(r.promptTokens).toEqual(STORIES_PROMPT_TOKENS);
    expect(r.timings.prompt_ms).toBeGreaterThan(0);
    expect(r.timings.decode_tok_s).toBeGreaterThan(0);
  });

  it('llama.cpp generator (node-llama-cpp) and llama.cpp stage give llama.cpp\'s greedy tokens', async () => {
    const gen = new StepperGenerator(await LlamaCppModel.load(path, { contextLength: 256, threads: 1 }), tokenizer);
    toDispose.push(gen);
    const stage = new LlamaCppStage({ threads: 1 });
    await stage.load(source, { start: 0, end: N_LAYER });
    toDispose.push(stage);
    const stageChain = new InProcessChain([stage]);
    for (const prompt of PROMPTS) {
      const tokens = tokenizer.encode(prompt);
      const ref = oracleGreedy(oracle, tokens, N);
      const viaStage = await chainGreedy(stageChain, tokens, N);
      expect(viaStage.tokens, prompt).toEqual(ref.tokens);
      const r = await gen.generate({ promptTokens: tokens, maxTokens: N });
      // generation stops at EOS; up to there the tokens are llama.cpp's
      expect(r.tokens, prompt).toEqual(ref.tokens.slice(0, r.tokens.length));
      if (r.tokens.length < N) expect(tokenizer.isEog(r.tokens.at(-1)!)).toBe(true);
    }
  });

  it('hidden state after layer k equals llama.cpp\'s l_out-(k-1) within 1e-4 for every k', async () => {
    const tokens = tokenizer.encode(PROMPTS[1]!);
    for (let k = 1; k < N_LAYER; k++) {
      const [stage] = await cpuStages([{ start: 0, end: k }]);
      await stage!.openSession('h', { contextLength: 64 });
      const out = (await stage!.forward('h', { kind: 'tokens', tokens: Int32Array.from(tokens) }, 0)).output;
      expect(out.kind).toBe('hidden');
      if (out.kind !== 'hidden') return;
      expect(out.nTokens).toBe(tokens.length);
      expect(maxAbsDiff(out.hidden, oracleHidden(oracle, tokens, k)), `k=${k}`).toBeLessThan(1e-4);
    }
  });

  it('split chains give bit-identical tokens and logits to the unsplit model', async () => {
    const whole = new InProcessChain(await cpuStages([{ start: 0, end: 5 }]));
    const tokens = tokenizer.encode(PROMPTS[0]!);
    const ref = await chainGreedy(whole, tokens, 24);
    for (const split of [[[0, 2], [2, 5]], [[0, 1], [1, 3], [3, 4], [4, 5]]]) {
      const chain = new InProcessChain(await cpuStages(split.map(([start, end]) => ({ start: start!, end: end! }))));
      const got = await chainGreedy(chain, tokens, 24);
      expect(got.tokens).toEqual(ref.tokens);
      got.logits.forEach((l, i) => expect(Buffer.from(l.buffer).equals(Buffer.from(ref.logits[i]!.buffer)), `step ${i}`).toBe(true));
    }
  });

  it('decode never reprocesses the prompt: every layer processed prompt + generated − 1 tokens', async () => {
    const stages = await cpuStages([{ start: 0, end: 2 }, { start: 2, end: 5 }]);
    const seen: number[][] = [];
    class Recording extends InProcessChain {
      override async releaseSession(id: string): Promise<void> {
        for (const s of this.stages) seen.push(s.sessionStats(id).processedTokens);
        await super.releaseSession(id);
      }
    }
    const prompt = tokenizer.encode(PROMPTS[3]!);
    const r = await generate(new Recording(stages), tokenizer, { promptTokens: prompt, maxTokens: 20, stopStrings: ['\u0000never'] });
    expect(r.stopReason === 'max_tokens' || r.stopReason === 'eog').toBe(true);
    // the last sampled token is never run: nothing needs its logits
    const expected = prompt.length + r.tokens.length - 1;
    expect(seen).toEqual([[expected, expected], [expected, expected, expected]]);
  });

  it('prefill in chunks (KV cache growing past its first allocation) gives the one-shot logits bit for bit', async () => {
    const [stage] = await cpuStages([{ start: 0, end: N_LAYER }]);
    const tokens = Int32Array.from({ length: 300 }, (_, i) => 3 + ((i * 97) % 500));
    await stage!.openSession('one', { contextLength: 1000 });
    await stage!.openSession('chunks', { contextLength: 1000 });
    const one = (await stage!.forward('one', { kind: 'tokens', tokens }, 0)).output;
    let last = one;
    for (let at = 0; at < 300; at += 70) last = (await stage!.forward('chunks', { kind: 'tokens', tokens: tokens.subarray(at, at + 70) }, at)).output;
    if (one.kind !== 'logits' || last.kind !== 'logits') throw new Error('expected logits');
    expect(Buffer.from(last.logits.buffer).equals(Buffer.from(one.logits.buffer))).toBe(true);
    expect(stage!.sessionStats('chunks').position).toBe(300);
    expect(stage!.sessionStats('chunks').kvBytes).toBe(2 * 5 * 512 * 32 * 4); // grown 256 → 512 positions
    await stage!.releaseSession('one');
    await stage!.releaseSession('chunks');
  });

  it('reads only its shard\'s tensors', async () => {
    const requested: string[] = [];
    const recording: TensorSource = {
      header: source.header,
      location: source.location,
      read: (tensors: readonly TensorInfo[]) => {
        requested.push(...tensors.map((t) => t.name));
        return source.read(tensors);
      },
      close: async () => {},
    };
    const b = new CpuBackend();
    await b.load(recording, { start: 2, end: 4 });
    await b.dispose();
    expect(requested.sort()).toEqual(shardTensors(source.header, { start: 2, end: 4 }, N_LAYER).map((t) => t.name).sort());
    expect(requested.every((n) => n.startsWith('blk.2.') || n.startsWith('blk.3.'))).toBe(true);
  });

  it('an unsupported architecture or tensor type fails at load, naming it', async () => {
    const withHeader = (patch: (h: TensorSource['header']) => TensorSource['header']): TensorSource => ({
      header: patch(source.header),
      location: source.location,
      read: () => Promise.reject(new Error('nothing should be read')),
      close: async () => {},
    });
    const gemma = withHeader((h) => ({ ...h, metadata: { ...h.metadata, 'general.architecture': 'gemma2' } }));
    await expect(new CpuBackend().load(gemma, { start: 0, end: 5 })).rejects.toMatchObject({ code: 'UNSUPPORTED_ARCHITECTURE', message: expect.stringContaining('gemma2') });
    const iq2 = withHeader((h) => ({
      ...h,
      tensors: h.tensors.map((t) => (t.name === 'blk.1.attn_q.weight' ? { ...t, type: GgmlType.IQ2_XXS } : t)),
    }));
    await expect(new CpuBackend().load(iq2, { start: 0, end: 5 })).rejects.toMatchObject({
      code: 'UNSUPPORTED_TENSOR_TYPE',
      message: expect.stringMatching(/blk\.1\.attn_q\.weight.*IQ2_XXS/),
    });
    // a shard without that layer gets past the type check (and fails only at our read stub)
    await expect(new CpuBackend().load(iq2, { start: 2, end: 3 })).rejects.toThrow('nothing should be read');
  });

  it('sessions: position mismatch, unknown session, full context and release are errors with codes', async () => {
    const [b] = await cpuStages([{ start: 0, end: 5 }]);
    const stage = b as StageBackend;
    const code = async (p: Promise<unknown>): Promise<string | undefined> => {
      try {
        await p;
        return undefined;
      } catch (e) {
        return isMeshError(e) ? e.code : String(e);
      }
    };
    await stage.openSession('a', { contextLength: 8 });
    const tokens = Int32Array.from(STORIES_PROMPT_TOKENS);
    expect(await code(stage.forward('a', { kind: 'tokens', tokens }, 1))).toBe('POSITION_MISMATCH');
    await stage.forward('a', { kind: 'tokens', tokens }, 0);
    expect(stage.sessionStats('a').position).toBe(5);
    expect(stage.sessionStats('a').kvBytes).toBe(2 * 5 * 8 * 32 * 4); // 2 × layers × positions × kvDim × f32
    expect(await code(stage.forward('a', { kind: 'tokens', tokens }, 0))).toBe('POSITION_MISMATCH');
    expect(await code(stage.forward('a', { kind: 'tokens', tokens }, 5))).toBe('CONTEXT_FULL');
    expect(await code(stage.forward('nope', { kind: 'tokens', tokens }, 0))).toBe('SESSION_UNKNOWN');
    expect(await code(stage.forward('a', { kind: 'hidden', hidden: new Float32Array(64), nTokens: 1 }, 5))).toBe('BAD_STAGE_INPUT');
    await stage.releaseSession('a');
    expect(b!.sessionIds()).toEqual([]);
    expect(() => stage.sessionStats('a')).toThrow(expect.objectContaining({ code: 'SESSION_UNKNOWN' }));
    expect(await code(stage.releaseSession('a'))).toBe('SESSION_UNKNOWN');
  });
});
