// Unit tests of the CPU engine's pure pieces on plain arrays: ops against naive formulas,
// ggml-style activation rounding, the sampler, stop-string streaming, model config and
// shard selection.
import { describe, expect, it } from 'vitest';
import { activationFormatFor, quantizeRowsQ8_0, roundActivations } from '../src/backends/cpu/act-round.ts';
import { attention, matmul, matmulRows, rmsnorm, rope, ropeCache, softmax, swiglu } from '../src/backends/cpu/ops.ts';
import { DenseMatrix, Int8Matrix, packInt8 } from '../src/backends/cpu/matrices.ts';
import { dequantize } from '../src/gguf/dequant.ts';
import { quantize } from '../src/gguf/quantize.ts';
import { WasmArena, wasmSimdAvailable } from '../src/backends/cpu/wasm-arena.ts';
import { q8x4Bytes } from '../src/backends/cpu/wasm-q8.ts';
import { parseLayerRanges, shardTensors } from '../src/backends/shard.ts';
import { isMeshError } from '../src/errors.ts';
import { GgmlType } from '../src/gguf/types.ts';
import type { GgufHeader, TensorInfo } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { RopeConfig } from '../src/model/config.ts';
import { Prng } from '../src/model/prng.ts';
import { Sampler } from '../src/model/sampler.ts';
import { TextCollector } from '../src/model/generation-output.ts';

function rand(n: number, seed = 1): Float32Array {
  const p = new Prng(seed);
  return Float32Array.from({ length: n }, () => p.next() * 2 - 1);
}

function codeOf(f: () => unknown): string | undefined {
  try {
    f();
    return undefined;
  } catch (e) {
    return isMeshError(e) ? e.code : String(e);
  }
}

describe('ops', () => {
  it('rmsnorm: x / rms(x) · w per row', () => {
    const x = rand(3 * 8);
    const w = rand(8, 2);
    const out = new Float32Array(24);
    rmsnorm(out, x, w, 3, 8, 1e-5);
    for (let r = 0; r < 3; r++) {
      const row = x.subarray(r * 8, r * 8 + 8);
      const rms = Math.sqrt(row.reduce((s, v) => s + v * v, 0) / 8 + 1e-5);
      for (let i = 0; i < 8; i++) expect(out[r * 8 + i]).toBeCloseTo((row[i]! / rms) * w[i]!, 6);
    }
  });

  it('matmul (batched, any shape) equals the naive triple loop; row tiles compose', () => {
    for (const [n, nIn, nOut] of [[1, 7, 5], [3, 16, 9], [5, 33, 12]] as const) {
      const x = rand(n * nIn, 3);
      const w = rand(nOut * nIn, 4);
      const y = new Float32Array(n * nOut);
      matmul(y, x, w, n, nIn, nOut);
      const tiled = new Float32Array(n * nOut);
      for (let r = 0; r < nOut; r += 4) {
        const r1 = Math.min(nOut, r + 4);
        matmulRows(tiled, x, w.slice(r * nIn, r1 * nIn), n, nIn, nOut, r, r1, 0);
      }
      for (let t = 0; t < n; t++) {
        for (let o = 0; o < nOut; o++) {
          let s = 0;
          for (let i = 0; i < nIn; i++) s += x[t * nIn + i]! * w[o * nIn + i]!;
          expect(y[t * nOut + o]).toBeCloseTo(s, 5);
          expect(tiled[t * nOut + o]).toBe(y[t * nOut + o]);
        }
      }
    }
  });

  it('the WebAssembly SIMD matmul agrees with the JS one (f32 lanes: to ~1e-6 relative), in the arena or staged', () => {
    expect(wasmSimdAvailable()).toBe(true);
    for (const [nIn, nOut] of [[8, 6], [64, 172], [256, 37]] as const) {
      const arena = new WasmArena(nIn * nOut * 4);
      const w = arena.alloc(nIn * nOut * 4);
      arena.f32(w, nIn * nOut).set(rand(nIn * nOut, 10));
      const m = new DenseMatrix('w', nOut, nIn, w, 'f32', arena);
      for (const n of [1, 2, 5]) {
        const x = rand(n * nIn, 11);
        const simd = new Float32Array(n * nOut);
        const js = new Float32Array(n * nOut);
        m.matmul(simd, x, n);
        matmul(js, x, arena.f32(w, nIn * nOut).slice(), n, nIn, nOut);
        for (let i = 0; i < js.length; i++) expect(Math.abs(simd[i]! - js[i]!)).toBeLessThan(1e-5);
        // x and y as views into the arena are used in place
        const xo = arena.alloc(n * nIn * 4);
        const yo = arena.alloc(n * nOut * 4);
        arena.f32(xo, n * nIn).set(x);
        m.matmul(arena.f32(yo, n * nOut), arena.f32(xo, n * nIn), n);
        expect([...arena.f32(yo, n * nOut)]).toEqual([...simd]);
        arena.free(xo);
        arena.free(yo);
      }
    }
  });

  it('the int8 kernel (Q8_0 and Q4_0, repacked four rows at a time) equals dequantised weights times Q8_0-rounded activations, whatever the batch', () => {
    for (const type of [GgmlType.Q8_0, GgmlType.Q4_0]) {
      for (const [nIn, nOut] of [[32, 4], [256, 12], [512, 36]] as const) {
        const raw = quantize(type, rand(nIn * nOut, nIn + type), nIn);
        const w = dequantize(type, raw, nIn * nOut); // [nOut × nIn]
        const arena = new WasmArena(nIn * nOut * 2);
        expect(arena.mmQ8).not.toBeNull();
        const at = arena.alloc(q8x4Bytes(nOut, nIn));
        packInt8(type, raw, nOut, nIn, arena.bytes, arena.heap, at);
        const m = new Int8Matrix('w', nOut, nIn, at, arena);
        // rows read back as the dequantised weights
        for (const r of [0, 1, nOut - 1]) {
          const row = new Float32Array(nIn);
          m.row(r, row, 0);
          expect([...row]).toEqual([...w.subarray(r * nIn, (r + 1) * nIn)]);
        }
        const x = rand(7 * nIn, 12);
        const all = new Float32Array(7 * nOut);
        m.matmul(all, x, 7);
        for (const n of [1, 2, 3, 4, 7]) {
          const y = new Float32Array(n * nOut);
          m.matmul(y, x, n);
          const ref = new Float32Array(n * nOut);
          matmul(ref, roundActivations(x, n, nIn, 'q8_0'), w, n, nIn, nOut);
          for (let i = 0; i < ref.length; i++) expect(Math.abs(y[i]! - ref[i]!)).toBeLessThan(1e-5 * Math.max(1, Math.abs(ref[i]!)));
          // a token's result does not depend on the batch it came in
          expect([...y]).toEqual([...all.subarray(0, n * nOut)]);
        }
      }
    }
  });

  const ropeCfg = (mode: 'normal' | 'neox', extra: Partial<RopeConfig> = {}): RopeConfig => ({
    mode,
    nRot: 8,
    freqBase: 10000,
    freqScale: 1,
    extFactor: 0,
    attnFactor: 1,
    betaFast: 32,
    betaSlow: 1,
    nCtxOrig: 2048,
    freqFactors: null,
    freqFactorsTensor: null,
    ...extra,
  });

  it('rope: normal rotates adjacent pairs, neox rotates halves, by p · base^(-2i/nRot)', () => {
    const headDim = 8;
    for (const mode of ['normal', 'neox'] as const) {
      const x = rand(2 * headDim, 5); // 2 tokens × 1 head
      const y = x.slice();
      rope(y, 2, 1, headDim, 3, ropeCfg(mode));
      for (let t = 0; t < 2; t++) {
        for (let i = 0; i < 4; i++) {
          const theta = (3 + t) * Math.pow(10000, (-2 * i) / 8);
          const [a, b] = mode === 'normal' ? [2 * i, 2 * i + 1] : [i, i + 4];
          const x0 = x[t * 8 + a]!, x1 = x[t * 8 + b]!;
          expect(y[t * 8 + a]).toBeCloseTo(x0 * Math.cos(theta) - x1 * Math.sin(theta), 4);
          expect(y[t * 8 + b]).toBeCloseTo(x0 * Math.sin(theta) + x1 * Math.cos(theta), 4);
        }
      }
    }
  });

  it('rope: linear scaling multiplies positions, llama3 factors divide frequencies', () => {
    const plain = new Float32Array(8);
    const scaled = new Float32Array(8);
    ropeCache(plain, 10, ropeCfg('normal'));
    ropeCache(scaled, 20, ropeCfg('normal', { freqScale: 0.5 }));
    for (let i = 0; i < 8; i++) expect(scaled[i]).toBeCloseTo(plain[i]!, 5);
    const factors = Float32Array.of(1, 2, 4, 8);
    const withFactors = new Float32Array(8);
    ropeCache(withFactors, 16, ropeCfg('normal', { freqFactors: factors }));
    for (let i = 0; i < 4; i++) {
      const theta = (16 * Math.pow(10000, (-2 * i) / 8)) / factors[i]!;
      expect(withFactors[2 * i]).toBeCloseTo(Math.cos(theta), 5);
      expect(withFactors[2 * i + 1]).toBeCloseTo(Math.sin(theta), 5);
    }
  });

  it('softmax sums to one; swiglu is silu(g)·u', () => {
    const x = Float32Array.of(1, 2, 3, 1000);
    softmax(x, 0, 3);
    expect(x[0]! + x[1]! + x[2]!).toBeCloseTo(1, 6);
    expect(x[3]).toBe(1000);
    const g = Float32Array.of(-2, 0, 3);
    const u = Float32Array.of(1, 5, 2);
    const out = new Float32Array(3);
    swiglu(out, g, u);
    [-2, 0, 3].forEach((v, i) => expect(out[i]).toBeCloseTo((v / (1 + Math.exp(-v))) * u[i]!, 6));
  });

  it('attention: causal GQA over the cache equals a naive computation, batched or one token at a time', () => {
    const nHead = 4, nHeadKv = 2, hd = 4, n = 5;
    const q = rand(n * nHead * hd, 6);
    const k = rand(n * nHeadKv * hd, 7);
    const v = rand(n * nHeadKv * hd, 8);
    const batched = new Float32Array(n * nHead * hd);
    attention(batched, q, k, v, n, 0, nHead, nHeadKv, hd);
    for (let t = 0; t < n; t++) {
      const one = new Float32Array(nHead * hd);
      attention(one, q.subarray(t * nHead * hd), k, v, 1, t, nHead, nHeadKv, hd);
      for (let i = 0; i < nHead * hd; i++) expect(one[i]).toBe(batched[t * nHead * hd + i]);
      for (let h = 0; h < nHead; h++) {
        const kvh = Math.floor(h / 2);
        const s: number[] = [];
        for (let j = 0; j <= t; j++) {
          let d = 0;
          for (let i = 0; i < hd; i++) d += q[(t * nHead + h) * hd + i]! * k[(j * nHeadKv + kvh) * hd + i]!;
          s.push(d / Math.sqrt(hd));
        }
        const m = Math.max(...s);
        const e = s.map((z) => Math.exp(z - m));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let i = 0; i < hd; i++) {
          let o = 0;
          for (let j = 0; j <= t; j++) o += (e[j]! / sum) * v[(j * nHeadKv + kvh) * hd + i]!;
          expect(batched[(t * nHead + h) * hd + i]).toBeCloseTo(o, 5);
        }
      }
    }
  });
});

describe('ggml activation rounding', () => {
  it('maps weight types to ggml vec_dot types', () => {
    expect(activationFormatFor(GgmlType.F32)).toBe('f32');
    expect(activationFormatFor(GgmlType.F16)).toBe('f16');
    expect(activationFormatFor(GgmlType.Q4_0)).toBe('q8_0');
    expect(activationFormatFor(GgmlType.Q8_0)).toBe('q8_0');
    expect(activationFormatFor(GgmlType.Q4_K)).toBe('q8_K');
    expect(activationFormatFor(GgmlType.Q6_K)).toBe('q8_K');
  });

  it('q8_0 gives scale × integer in [-127, 127] per 32-block, close to x', () => {
    const x = rand(64, 9);
    const r = roundActivations(x, 1, 64, 'q8_0');
    for (let b = 0; b < 2; b++) {
      const block = x.subarray(b * 32, b * 32 + 32);
      const amax = Math.max(...block.map(Math.abs));
      const d = r.reduce((m, v, i) => (i >= b * 32 && i < b * 32 + 32 ? Math.max(m, Math.abs(v)) : m), 0) / 127;
      for (let i = 0; i < 32; i++) {
        const q = r[b * 32 + i]! / d;
        expect(Math.abs(q - Math.round(q))).toBeLessThan(1e-3);
        expect(Math.abs(r[b * 32 + i]! - x[b * 32 + i]!)).toBeLessThanOrEqual(amax / 127);
      }
    }
    expect(roundActivations(x, 1, 64, 'f32')).toBe(x);
  });

  it('the WebAssembly Q8_0 quantiser gives quantizeRowsQ8_0\'s integers and scales bit for bit, f16-subnormal and overflowing scales included', () => {
    // per block a magnitude: zero, f16-subnormal scales (amax/127 < 2^-14), normal, past f16's range; ties to even among both
    const scales = [0, 1e-9, 3e-7, 127 * 2 ** -24 * 1.5, 127 * 2 ** -24 * 2.5, 127 * 2 ** -14 * 0.9999, 127 * 2 ** -14, 1e-3, 1, 127 * (1 + 2 ** -11), 127 * (1 + 3 * 2 ** -11), 37.5, 1e4, 127 * 65504, 127 * 65519, 127 * 65520, 1e8];
    const nBlocks = scales.length * 4;
    const x = rand(nBlocks * 32, 21);
    for (let b = 0; b < nBlocks; b++) for (let i = 0; i < 32; i++) x[b * 32 + i] = x[b * 32 + i]! * scales[b % scales.length]!;
    // blocks whose largest value is exactly the scale (so amax/127 lands on the chosen f16 boundaries)
    for (let b = 0; b < scales.length; b++) x[b * 32 + 5] = -scales[b]!;
    const q = new Int16Array(nBlocks * 32);
    const d = new Float32Array(nBlocks);
    quantizeRowsQ8_0(x, 1, nBlocks * 32, q, 0, d, 0);
    const arena = new WasmArena(1 << 20);
    const xo = arena.alloc(x.byteLength), qo = arena.alloc(q.byteLength), dOff = arena.alloc(d.byteLength);
    arena.heap.set(x, xo >> 2);
    arena.quantQ8!(xo, nBlocks, qo, dOff);
    expect([...arena.halves.subarray(qo >> 1, (qo >> 1) + q.length)]).toEqual([...q]);
    expect([...new Uint32Array(arena.heap.buffer, dOff, nBlocks)]).toEqual([...new Uint32Array(d.buffer)]);
    expect(d).toContain(Infinity);
  });
});

describe('sampler', () => {
  const logits = Float32Array.of(0.1, 2, 1.9, -1, 0.5);

  it('temperature 0 is greedy, the lowest id on ties', () => {
    expect(new Sampler().sample(logits)).toBe(1);
    expect(new Sampler().sample(Float32Array.of(1, 3, 3))).toBe(1);
  });

  it('repetition penalty demotes recent tokens', () => {
    expect(new Sampler({ repeatPenalty: 1.2 }).sample(logits, [1])).toBe(2);
  });

  it('is deterministic for a seed and varies across seeds', () => {
    const draw = (seed: number) => {
      const s = new Sampler({ temperature: 1.5, seed });
      return Array.from({ length: 50 }, () => s.sample(logits));
    };
    expect(draw(7)).toEqual(draw(7));
    expect(draw(7)).not.toEqual(draw(8));
  });

  it('top-k, top-p and min-p restrict the candidates', () => {
    const seen = (opts: ConstructorParameters<typeof Sampler>[0]) => {
      const s = new Sampler({ temperature: 5, seed: 3, ...opts });
      return new Set(Array.from({ length: 300 }, () => s.sample(logits)));
    };
    expect(seen({}).size).toBe(5);
    expect([...seen({ topK: 2 })].sort()).toEqual([1, 2]);
    expect([...seen({ topP: 0.5 })].sort()).toEqual([1, 2]);
    expect([...seen({ minP: 0.5 })].sort()).toEqual([1, 2]);
  });

  it('rejects bad options with a code', () => {
    expect(codeOf(() => new Sampler({ temperature: -1 }))).toBe('BAD_SAMPLER_OPTION');
    expect(codeOf(() => new Sampler({ topP: 0 }))).toBe('BAD_SAMPLER_OPTION');
  });
});

describe('stop strings', () => {
  it('streams everything before a stop string, never part of it', () => {
    const deltas: string[] = [];
    const c = new TextCollector(['</s>', 'END'], (d) => deltas.push(d));
    expect(c.push('Hello <')).toBe(false);
    expect(c.push('/')).toBe(false);
    expect(c.push('s> more')).toBe(true);
    expect(c.text).toBe('Hello ');
    expect(deltas.join('')).toBe('Hello ');
    const d2 = new TextCollector(['END']);
    expect(d2.push('the EN')).toBe(false);
    expect(d2.text).toBe('the ');
    expect(d2.push('D', false)).toBe(true);
    expect(d2.text).toBe('the ');
    const d3 = new TextCollector(['END']);
    d3.push('E');
    d3.push('', true);
    expect(d3.text).toBe('E');
  });
});

describe('model config and shards', () => {
  function header(arch: string, extra: Record<string, number | string> = {}, tensors: string[] = []): GgufHeader {
    const t = (name: string): TensorInfo => ({ name, type: GgmlType.F32, shape: [4], nElements: 4, offset: 0, byteLength: 16 });
    return {
      version: 3,
      metadata: {
        'general.architecture': arch,
        [`${arch}.block_count`]: 3,
        [`${arch}.embedding_length`]: 64,
        [`${arch}.feed_forward_length`]: 128,
        [`${arch}.attention.head_count`]: 8,
        [`${arch}.attention.head_count_kv`]: 2,
        [`${arch}.attention.layer_norm_rms_epsilon`]: 1e-6,
        [`${arch}.vocab_size`]: 100,
        ...extra,
      },
      tensors: ['token_embd.weight', 'output_norm.weight', ...tensors, ...[0, 1, 2].flatMap((l) => [`blk.${l}.attn_q.weight`, `blk.${l}.ffn_up.weight`])].map(t),
      tensorDataOffset: 0,
      alignment: 32,
      fileBytes: 0,
    };
  }

  it('reads llama, qwen2 and qwen3 hyper-parameters', () => {
    const llama = configFromHeader(header('llama', { 'llama.rope.freq_base': 500000, 'llama.rope.scaling.type': 'linear', 'llama.rope.scaling.factor': 4 }, ['rope_freqs.weight', 'output.weight']));
    expect(llama).toMatchObject({ architecture: 'llama', nLayer: 3, nEmbd: 64, nHead: 8, nHeadKv: 2, headDim: 8, nFf: 128, nVocab: 100, tiedEmbeddings: false, qkvBias: false, qkNorm: false });
    expect(llama.rope).toMatchObject({ mode: 'normal', nRot: 8, freqBase: 500000, freqScale: 0.25, freqFactorsTensor: 'rope_freqs.weight' });
    const qwen2 = configFromHeader(header('qwen2', {}, ['blk.0.attn_q.bias']));
    expect(qwen2).toMatchObject({ architecture: 'qwen2', qkvBias: true, tiedEmbeddings: true, rope: { mode: 'neox' } });
    expect(configFromHeader(header('qwen3')).qkNorm).toBe(true);
  });

  it('names an unsupported architecture or rope scaling', () => {
    const e = (() => {
      try {
        configFromHeader(header('gemma2'));
      } catch (err) {
        return err;
      }
    })();
    expect(isMeshError(e, 'UNSUPPORTED_ARCHITECTURE')).toBe(true);
    expect((e as Error).message).toContain('gemma2');
    expect(codeOf(() => configFromHeader(header('llama', { 'llama.rope.scaling.type': 'ntk-by-parts' })))).toBe('UNSUPPORTED_ROPE_SCALING');
    // a MoE of an architecture we run only dense, or one without its expert count
    expect(codeOf(() => configFromHeader(header('qwen3moe')))).toBe('BAD_MODEL_METADATA');
    expect(codeOf(() => configFromHeader(header('llama', { 'llama.expert_count': 8 })))).toBe('UNSUPPORTED_ARCHITECTURE');
  });

  it('a shard reads its layers, the embedding at the start and the head at the end', () => {
    const h = header('llama');
    const names = (s: number, e: number) => shardTensors(h, { start: s, end: e }, 3).map((t) => t.name);
    expect(names(0, 1)).toEqual(['token_embd.weight', 'blk.0.attn_q.weight', 'blk.0.ffn_up.weight']);
    expect(names(1, 2)).toEqual(['blk.1.attn_q.weight', 'blk.1.ffn_up.weight']);
    // tied embeddings: the head is token_embd
    expect(names(2, 3)).toEqual(['token_embd.weight', 'output_norm.weight', 'blk.2.attn_q.weight', 'blk.2.ffn_up.weight']);
    expect(codeOf(() => names(2, 4))).toBe('BAD_SHARD');
  });

  it('parses layer splits and names gaps', () => {
    expect(parseLayerRanges('0-2,2-5', 5)).toEqual([{ start: 0, end: 2 }, { start: 2, end: 5 }]);
    expect(codeOf(() => parseLayerRanges('0-2,3-5', 5))).toBe('BAD_SHARD');
    expect(codeOf(() => parseLayerRanges('0-2', 5))).toBe('BAD_SHARD');
    expect(codeOf(() => parseLayerRanges('0-x', 5))).toBe('BAD_SHARD');
  });
});
