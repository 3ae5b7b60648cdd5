// Qwen3.5 (qwen35, qwen35moe) on the CPU reference: against llama.cpp (which has
// src/models/qwen35moe.cpp) on synthetic models — greedy tokens, prompt logits, the hidden
// state after a Gated DeltaNet block, a prompt longer than several chunks, a split route — and
// against an independent float64 delta rule. Then the session model's recurrent state: results
// that do not depend on how tokens are batched, rewinds (within the chunk, to the checkpoint of
// a forward that crossed a chunk end, to 0, refused elsewhere), and its memory accounting.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { CHUNK, DeltaChunkState, deltaLayerBytes, deltaStep } from '../src/backends/cpu/delta-chunk.ts';
import { deltaRuleRecurrent, l2NormRows } from '../src/backends/cpu/delta-net.ts';
import { silu } from '../src/backends/cpu/ops.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { LinearAttentionConfig } from '../src/model/config.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { PROMPT } from './support/arch-cases.ts';
import { FLIP_BOUND, LlamaModelFfi, maxAbsDiff, oracleHidden } from './support/llamacpp-oracle.ts';
import { expectFirstLayerMatchesOracle, expectGreedyMatchesOracle } from './support/oracle-check.ts';
import { Prng } from '../src/model/prng.ts';
import { syntheticModel } from './support/synthetic.ts';

/** 4 blocks: DeltaNet 0-2 (2 q/k heads, 4 v heads of 32), full attention on 3 (4 heads / 2 KV of 64, 16 rotated dims). */
const SHAPE: MakeModelOptions = { layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512, linearKHeads: 2, linearVHeads: 4, linearHeadDim: 32 };
const MOE: MakeModelOptions = { ...SHAPE, arch: 'qwen35moe', expertFfn: 256, sharedFfn: 256 };
const DENSE: MakeModelOptions = { ...SHAPE, arch: 'qwen35' };
const LONG_PROMPT = Array.from({ length: 6 }, () => PROMPT).join(' '); // > 2 chunks of tokens

const open: TensorSource[] = [];
afterAll(async () => {
  for (const s of open) await s.close();
});

async function stage(path: string, start = 0, end?: number): Promise<CpuBackend> {
  const source = await openTensorSource(path);
  open.push(source);
  const b = new CpuBackend();
  await b.load(source, { start, end: end ?? configFromHeader(source.header).nLayer });
  return b;
}

describe('qwen35 / qwen35moe on the CPU reference against llama.cpp', () => {
  it.each([
    ['qwen35moe F32', MOE, true],
    ['qwen35 F32', DENSE, true],
  ] as const)('%s: greedy 16 tokens, prompt logits, the first DeltaNet block\'s output', async (label, options, exact) => {
    const path = await syntheticModel(options);
    const oracle = await LlamaModelFfi.load(path);
    const chain = new InProcessChain([await stage(path)]);
    try {
      const prompt = oracle.tokenize(PROMPT);
      await expectGreedyMatchesOracle(`cpu ${label}`, chain, oracle, prompt, 16, { exact, tolerance: 1e-4 });
      if (exact) await expectFirstLayerMatchesOracle(open.at(-1)!, oracle, prompt, 1e-4);
    } finally {
      await chain.dispose();
      oracle.dispose();
    }
  });

  // ggml rounds activations to 8-bit blocks before each quantised matmul, and so do we; an f32
  // difference in the last bit sometimes moves one value across a rounding boundary (one row,
  // ~1e-3). Attention dilutes such a flip; the DeltaNet state carries it to every later token,
  // so later rows and the prompt's logits can differ by a few flips. Checked: rows agree to
  // 1e-5 but for flipped ones, and the flips stay small.
  it('qwen35moe Q8_0: the first DeltaNet block agrees row for row but for rounding flips', async () => {
    const path = await syntheticModel({ ...MOE, type: 'q8_0' });
    const oracle = await LlamaModelFfi.load(path);
    try {
      const prompt = oracle.tokenize(PROMPT);
      const first = await stage(path, 0, 1);
      await first.openSession('h', { contextLength: prompt.length });
      const out = (await first.forward('h', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
      const ref = oracleHidden(oracle, prompt, 1);
      const rows = prompt.map((_, t) => (out.kind === 'hidden' ? maxAbsDiff(out.hidden.subarray(t * 256, (t + 1) * 256), ref.subarray(t * 256, (t + 1) * 256)) : Infinity));
      console.log(`cpu qwen35moe Q8_0 block 0: row diffs ${rows.map((d) => d.toExponential(1)).join(' ')}`);
      expect(rows.filter((d) => d > 1e-5).length).toBeLessThanOrEqual(2);
      expect(Math.max(...rows)).toBeLessThan(FLIP_BOUND);
      await first.dispose();
    } finally {
      oracle.dispose();
    }
  });

  it(`a prompt of several ${CHUNK}-token chunks, and the route split [0, 2) + [2, 4): llama.cpp's logits and tokens`, async () => {
    const path = await syntheticModel(MOE);
    const oracle = await LlamaModelFfi.load(path);
    const chain = new InProcessChain([await stage(path, 0, 2), await stage(path, 2, 4)]);
    try {
      const prompt = oracle.tokenize(LONG_PROMPT);
      expect(prompt.length).toBeGreaterThan(2 * CHUNK);
      const r = await expectGreedyMatchesOracle('cpu qwen35moe split, long prompt', chain, oracle, prompt, 8, { exact: true, tolerance: 1e-4 });
      expect(r.firstDiff).toBe(-1);
    } finally {
      await chain.dispose();
      oracle.dispose();
    }
  });
});

/** A straightforward float64 Gated DeltaNet token mixer: conv, SiLU, L2-norm, delta rule. */
function reference64(la: LinearAttentionConfig, mixed: Float32Array, w: Float32Array, g: Float32Array, beta: Float32Array, n: number, eps: number): Float64Array {
  const { nKHeads: nK, nVHeads: nV, headDim: d, convKernel: K, convChannels: ch } = la;
  const out = new Float64Array(n * nV * d);
  const S = Array.from({ length: nV }, () => new Float64Array(d * d)); // S[i·d + j], key i, value j
  const x = new Float64Array(ch);
  for (let t = 0; t < n; t++) {
    for (let c = 0; c < ch; c++) {
      let s = 0;
      for (let j = 0; j < K; j++) {
        const src = t - (K - 1) + j;
        if (src >= 0) s += mixed[src * ch + c]! * w[c * K + j]!;
      }
      x[c] = s / (1 + Math.exp(-s));
    }
    for (let h = 0; h < 2 * nK; h++) {
      let ss = 0;
      for (let i = 0; i < d; i++) ss += x[h * d + i]! ** 2;
      const sc = 1 / Math.max(Math.sqrt(ss), eps);
      for (let i = 0; i < d; i++) x[h * d + i]! *= sc;
    }
    for (let h = 0; h < nV; h++) {
      const q = (h % nK) * d;
      const k = nK * d + (h % nK) * d;
      const v = 2 * nK * d + h * d;
      const s = S[h]!;
      const decay = Math.exp(g[t * nV + h]!);
      for (let i = 0; i < d * d; i++) s[i]! *= decay;
      for (let j = 0; j < d; j++) {
        let sk = 0;
        for (let i = 0; i < d; i++) sk += s[i * d + j]! * x[k + i]!;
        const delta = beta[t * nV + h]! * (x[v + j]! - sk);
        for (let i = 0; i < d; i++) s[i * d + j]! += x[k + i]! * delta;
      }
      for (let j = 0; j < d; j++) {
        let o = 0;
        for (let i = 0; i < d; i++) o += s[i * d + j]! * x[q + i]!;
        out[(t * nV + h) * d + j] = o / Math.sqrt(d);
      }
    }
  }
  return out;
}

describe('the chunked delta rule', () => {
  const la: LinearAttentionConfig = { convKernel: 4, headDim: 16, nKHeads: 2, nVHeads: 4, convChannels: 2 * 2 * 16 + 4 * 16 };
  const n = 3 * CHUNK + 5;
  const rng = new Prng(7);
  const rand = (len: number, scale: number, offset = 0) => Float32Array.from({ length: len }, () => offset + scale * rng.normal());
  const mixed = rand(n * la.convChannels, 1);
  const w = rand(la.convChannels * la.convKernel, 0.5);
  const g = Float32Array.from(rand(n * la.nVHeads, 0.3, -0.4), (x) => -Math.abs(x));
  const beta = Float32Array.from(rand(n * la.nVHeads, 1), (x) => 1 / (1 + Math.exp(-x)));
  const eps = 1e-6;

  /** runs the engine's token step over [from, to) */
  function run(st: DeltaChunkState, from: number, to: number, o: Float32Array): void {
    const { nVHeads: nV, headDim: d, convChannels: ch } = la;
    for (let t = from; t < to; t++) {
      const inputs = { mixed: mixed.subarray(t * ch, (t + 1) * ch), g: g.subarray(t * nV, (t + 1) * nV), beta: beta.subarray(t * nV, (t + 1) * nV) };
      deltaStep(st, w, inputs, o.subarray(t * nV * d, (t + 1) * nV * d), eps, () => undefined);
    }
  }

  it('equals an independent float64 delta rule and the token-by-token f32 recurrence across chunk ends', () => {
    const ref = reference64(la, mixed, w, g, beta, n, eps);
    const o = new Float32Array(n * la.nVHeads * la.headDim);
    run(new DeltaChunkState(la), 0, n, o);
    const scale = Math.max(...Array.from(ref, Math.abs));
    expect(maxAbsDiff(o, ref) / scale).toBeLessThan(1e-5);

    // the recurrent form on the same conv/norm outputs (the llama.cpp fused op's order, f32)
    const { nKHeads: nK, nVHeads: nV, headDim: d, convChannels: ch, convKernel: K } = la;
    const q = new Float32Array(n * nK * d), k = new Float32Array(n * nK * d), v = new Float32Array(n * nV * d);
    for (let t = 0; t < n; t++) {
      const x = new Float32Array(ch);
      for (let c = 0; c < ch; c++) {
        let s = 0;
        for (let j = 0; j < K; j++) if (t - K + 1 + j >= 0) s = Math.fround(s + Math.fround(mixed[(t - K + 1 + j) * ch + c]! * w[c * K + j]!));
        x[c] = silu(s);
      }
      l2NormRows(x, 0, 2 * nK, d, d, eps);
      q.set(x.subarray(0, nK * d), t * nK * d);
      k.set(x.subarray(nK * d, 2 * nK * d), t * nK * d);
      v.set(x.subarray(2 * nK * d), t * nV * d);
    }
    const rec = new Float32Array(n * nV * d);
    deltaRuleRecurrent(rec, { q, k, v, g, beta }, new Float32Array(nV * d * d), n, { nK, nV, d });
    expect(maxAbsDiff(rec, ref) / scale).toBeLessThan(1e-5);
  });
});

describe('recurrent state in a session', () => {
  it('gives bit-identical logits however the tokens are batched (prefill + decode steps, or one prefill)', async () => {
    const be = await stage(await syntheticModel(MOE));
    const tokens = Int32Array.from({ length: 2 * CHUNK + 7 }, (_, i) => (i * 37 + 11) % 1000);
    await be.openSession('whole', { contextLength: 128 });
    const whole = (await be.forward('whole', { kind: 'tokens', tokens }, 0)).output;
    await be.openSession('steps', { contextLength: 128 });
    let last = (await be.forward('steps', { kind: 'tokens', tokens: tokens.subarray(0, 29) }, 0)).output;
    // then steps of 1 and 5 tokens: decode steps and small prefill frames, across two chunk ends
    for (let p = 29, i = 0; p < tokens.length; i++) {
      const end = Math.min(tokens.length, p + (i % 2 === 0 ? 1 : 5));
      last = (await be.forward('steps', { kind: 'tokens', tokens: tokens.subarray(p, end) }, p)).output;
      p = end;
    }
    expect(be.sessionStats('steps').position).toBe(tokens.length);
    expect(last.kind === 'logits' && whole.kind === 'logits' && Array.from(last.logits)).toEqual(whole.kind === 'logits' && Array.from(whole.logits));
    await be.dispose();
  });

  it('rewinds within the chunk, to the checkpoint of a step that crossed a chunk end, and to 0; refuses elsewhere', async () => {
    const be = await stage(await syntheticModel(MOE));
    const tokens = Int32Array.from({ length: 2 * CHUNK + 3 }, (_, i) => (i * 53 + 5) % 1000);
    const logitsAt = async (id: string, from: number, to: number) => {
      const out = (await be.forward(id, { kind: 'tokens', tokens: tokens.subarray(from, to) }, from)).output;
      return out.kind === 'logits' ? Array.from(out.logits) : [];
    };
    await be.openSession('s', { contextLength: 128 });
    await logitsAt('s', 0, CHUNK - 2);
    const a = await logitsAt('s', CHUNK - 2, CHUNK - 1);
    // within the chunk: back one step and again
    await be.truncateSession('s', CHUNK - 2);
    expect(await logitsAt('s', CHUNK - 2, CHUNK - 1)).toEqual(a);
    // a step over the chunk end (a prefill frame of 4 tokens), rewound and sent again
    const b = await logitsAt('s', CHUNK - 1, CHUNK + 3);
    await be.truncateSession('s', CHUNK - 1);
    expect(await logitsAt('s', CHUNK - 1, CHUNK + 3)).toEqual(b);
    // two chunks on, the first chunk's positions are gone: POSITION_MISMATCH, nothing changed
    await logitsAt('s', CHUNK + 3, 2 * CHUNK + 2);
    const c = await logitsAt('s', 2 * CHUNK + 2, 2 * CHUNK + 3);
    await expect(be.truncateSession('s', 5)).rejects.toMatchObject({ code: 'POSITION_MISMATCH' });
    expect(be.sessionStats('s').position).toBe(2 * CHUNK + 3);
    // back to 0 and replayed: the same logits
    await be.truncateSession('s', 0);
    await logitsAt('s', 0, 2 * CHUNK + 2);
    expect(await logitsAt('s', 2 * CHUNK + 2, 2 * CHUNK + 3)).toEqual(c);
    await be.releaseSession('s');
    expect(be.sessionIds()).toEqual([]);
    await be.dispose();
  });

  it('accounts its memory: KV on the attention block only, a fixed state on each DeltaNet block', async () => {
    const be = await stage(await syntheticModel(MOE));
    const la = be.config.linearAttention!;
    await be.openSession('m', { contextLength: 1024 });
    await be.forward('m', { kind: 'tokens', tokens: Int32Array.from({ length: 10 }, (_, i) => i + 3) }, 0);
    const s1 = be.sessionStats('m');
    // 1 attention block: keys + values for 256 positions (the first allocation) × 2 KV heads × 64, f32
    expect(s1.kvBytes).toBe(2 * 256 * 2 * 64 * 4);
    expect(s1.recurrentBytes).toBe(3 * deltaLayerBytes(la));
    // fixed: 300 more positions grow the KV cache, not the state (plus one checkpoint per layer)
    await be.forward('m', { kind: 'tokens', tokens: Int32Array.from({ length: 300 }, (_, i) => (i * 7) % 1000) }, 10);
    const s2 = be.sessionStats('m');
    expect(s2.kvBytes).toBe(2 * 512 * 2 * 64 * 4);
    expect(s2.recurrentBytes).toBe(2 * 3 * deltaLayerBytes(la));
    await be.dispose();
  });
});
