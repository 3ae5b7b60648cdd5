// The CPU engine's memory and its attention over the KV cache: the arena's allocator and growth,
// and attendCached (two kernel products per head) against the reference ops.attention, for
// grouped KV heads, one token or a chunk, a sliding window, and a cache that grows between
// chunks; a session rolled back (truncateSession); worker threads.
import { describe, expect, it } from 'vitest';
import { attendCached, attentionScratchBytes } from '../src/backends/cpu/attention.ts';
import { KERNEL_IDS } from '../src/backends/cpu/compute-pool.ts';
import { createNodeCpuBackend, nodeWorkers } from '../src/backends/cpu/node-threads.ts';
import { KvCache } from '../src/backends/cpu/kv-cache.ts';
import { attention, swiglu } from '../src/backends/cpu/ops.ts';
import { swigluInArena } from '../src/backends/cpu/arena-ops.ts';
import { relaxedSimdAvailable } from '../src/backends/cpu/wasm-asm.ts';
import { WasmArena } from '../src/backends/cpu/wasm-arena.ts';
import { isMeshError } from '../src/errors.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { argmax } from '../src/model/sampler.ts';
import { stories260K } from './support/models.ts';
import { Prng } from '../src/model/prng.ts';

function rand(n: number, seed = 1): Float32Array {
  const p = new Prng(seed);
  return Float32Array.from({ length: n }, () => p.next() * 2 - 1);
}

describe('WasmArena', () => {
  it('allocates 16-byte aligned regions, reuses and merges freed ones, and grows keeping the bytes', () => {
    const arena = new WasmArena(65536);
    const a = arena.alloc(100);
    const b = arena.alloc(40000);
    const c = arena.alloc(16);
    expect([a % 16, b % 16, c % 16]).toEqual([0, 0, 0]);
    arena.f32(b, 4).set([1, 2, 3, 4]);
    // past the first page: the memory grows, and what was written stays
    const big = arena.alloc(200_000, true);
    expect(arena.capacity).toBeGreaterThanOrEqual(big + 200_000);
    expect([...arena.f32(b, 4)]).toEqual([1, 2, 3, 4]);
    expect(arena.f32(big, 50_000).every((v) => v === 0)).toBe(true);
    // freeing a and b leaves one merged hole that a region of their joint size fits
    arena.free(a);
    arena.free(b);
    expect(arena.alloc(40000 + 112)).toBe(a);
    expect(isMeshError(catchIt(() => arena.free(12345)))).toBe(true);
  });

  it('knows its own views: arrays elsewhere are staged, views are used in place', () => {
    const arena = new WasmArena(65536);
    const r = arena.alloc(64);
    expect(arena.offsetOf(arena.f32(r, 16))).toBe(r);
    expect(arena.offsetOf(new Float32Array(16))).toBe(-1);
  });
});

function catchIt(f: () => void): unknown {
  try {
    f();
    return undefined;
  } catch (e) {
    return e;
  }
}

describe('KvCache', () => {
  it('keeps every key and value when it grows, in place at the end of the arena or moved elsewhere', () => {
    for (const blocked of [false, true]) {
      const arena = new WasmArena(1 << 16);
      const kv = new KvCache(arena, 2, 2, 4, 1000);
      const k = rand(300 * 8, 31);
      const v = rand(300 * 8, 32);
      kv.reserve(200);
      for (let l = 0; l < 2; l++) kv.write(l, 0, k, v, 200);
      kv.length = 200;
      const after = blocked ? arena.alloc(64) : -1; // something after the cache: it must move
      kv.reserve(100); // 256 → 512 positions
      expect(kv.capacity).toBe(512);
      for (let l = 0; l < 2; l++) kv.write(l, 200, k.subarray(200 * 8), v.subarray(200 * 8), 100);
      const heap = arena.heap;
      for (let l = 0; l < 2; l++) {
        for (let h = 0; h < 2; h++) {
          for (let p = 0; p < 512; p++) {
            for (let d = 0; d < 4; d++) {
              const want = (x: Float32Array) => (p < 300 ? x[p * 8 + h * 4 + d]! : 0);
              expect(heap[(kv.keys(l, h) >> 2) + p * 4 + d]).toBe(want(k));
              expect(heap[(kv.values(l, h) >> 2) + d * 512 + p]).toBe(want(v));
            }
          }
        }
      }
      if (after >= 0) arena.free(after);
    }
  });
});

describe('attention over the KV cache', () => {
  const shape = { nHead: 4, nHeadKv: 2, headDim: 8 };
  const kvDim = shape.nHeadKv * shape.headDim;
  const qDim = shape.nHead * shape.headDim;
  const n = 300; // past the cache's first 256 positions

  /** runs attendCached over the tokens in chunks of `chunk` (with a score scale and window, if given); returns [n × qDim] */
  function cached(q: Float32Array, k: Float32Array, v: Float32Array, chunk: number, threads = 1, scale?: number, window = 0): Float32Array {
    const arena = new WasmArena(1 << 16, { shared: threads > 1 });
    if (threads > 1) arena.startThreads(threads - 1, nodeWorkers);
    const kv = new KvCache(arena, 1, shape.nHeadKv, shape.headDim, 512);
    const out = new Float32Array(n * qDim);
    for (let pos = 0; pos < n; pos += chunk) {
      const m = Math.min(chunk, n - pos);
      kv.reserve(m);
      const qo = arena.alloc(m * qDim * 4);
      const oo = arena.alloc(m * qDim * 4);
      const so = arena.alloc(attentionScratchBytes(shape, m, pos));
      arena.f32(qo, m * qDim).set(q.subarray(pos * qDim, (pos + m) * qDim));
      kv.write(0, pos, k.subarray(pos * kvDim), v.subarray(pos * kvDim), m);
      attendCached(kv, 0, shape, qo, oo, m, pos, so, scale, window);
      out.set(arena.f32(oo, m * qDim), pos * qDim);
      kv.length = pos + m;
      for (const o of [qo, oo, so]) arena.free(o);
    }
    arena.dispose();
    return out;
  }

  it('equals the reference (f32 sums vs f64: 1e-5), and a token gets the same bits in any chunk', () => {
    const q = rand(n * qDim, 1);
    const k = rand(n * kvDim, 2);
    const v = rand(n * kvDim, 3);
    const ref = new Float32Array(n * qDim);
    attention(ref, q, k, v, n, 0, shape.nHead, shape.nHeadKv, shape.headDim);
    const oneShot = cached(q, k, v, n);
    let worst = 0;
    for (let i = 0; i < ref.length; i++) worst = Math.max(worst, Math.abs(oneShot[i]! - ref[i]!));
    expect(worst).toBeLessThan(1e-5);
    // decode (one token, a KV head's query heads batched), odd chunks crossing the cache's growth
    for (const chunk of [1, 7, 64]) expect(Buffer.from(cached(q, k, v, chunk).buffer).equals(Buffer.from(oneShot.buffer)), `chunk ${chunk}`).toBe(true);
    // on two threads a chunk's rows are cut into pieces, the early ones reading fewer keys
    for (const chunk of [n, 64]) expect(Buffer.from(cached(q, k, v, chunk, 2).buffer).equals(Buffer.from(oneShot.buffer)), `chunk ${chunk}, 2 threads`).toBe(true);
  });

  it('a sliding window and a score scale of 1 (gemma3) follow the reference, in any chunk', () => {
    const q = rand(n * qDim, 4);
    const k = rand(n * kvDim, 5);
    const v = rand(n * kvDim, 6);
    const window = 40;
    const ref = new Float32Array(n * qDim);
    attention(ref, q, k, v, n, 0, shape.nHead, shape.nHeadKv, shape.headDim, undefined, 1, window);
    for (const chunk of [n, 16, 1]) {
      const got = cached(q, k, v, chunk, 1, 1, window);
      let worst = 0;
      for (let i = 0; i < ref.length; i++) worst = Math.max(worst, Math.abs(got[i]! - ref[i]!));
      expect(worst, `chunk ${chunk}`).toBeLessThan(1e-5);
    }
  });
});

describe('session rollback', () => {
  it('truncateSession then new tokens gives a fresh session\'s logits bit for bit, across the cache\'s growth', async () => {
    const source = await openTensorSource(await stories260K());
    const b = createNodeCpuBackend({ threads: 1 });
    await b.load(source, { start: 0, end: 5 });
    const tokens = (n: number, seed: number) => Int32Array.from({ length: n }, (_, i) => 1 + ((i * 37 + seed) % 500));
    const prefix = tokens(250, 0);
    const logitsOf = async (id: string, parts: Int32Array[]) => {
      let pos = 0;
      let r;
      for (const p of parts) {
        r = await b.forward(id, { kind: 'tokens', tokens: p }, pos);
        pos += p.length;
      }
      if (r!.output.kind !== 'logits') throw new Error('expected logits');
      return r!.output.logits;
    };
    // a session that went 60 tokens past the prefix (its cache grew past 256 positions), then rolled back
    await b.openSession('rolled', { contextLength: 512 });
    await logitsOf('rolled', [prefix, tokens(60, 3)]);
    await b.truncateSession('rolled', 250);
    expect(b.sessionStats('rolled').position).toBe(250);
    const after = tokens(9, 7);
    let r = await b.forward('rolled', { kind: 'tokens', tokens: after }, 250);
    const rolled = r.output.kind === 'logits' ? r.output.logits : null;
    await b.openSession('fresh', { contextLength: 512 });
    const fresh = await logitsOf('fresh', [prefix, after]);
    expect(Buffer.from(rolled!.buffer).equals(Buffer.from(fresh.buffer))).toBe(true);
    // and one decode step more, still equal
    const next = Int32Array.of(argmax(fresh));
    r = await b.forward('rolled', { kind: 'tokens', tokens: next }, 259);
    const r2 = await b.forward('fresh', { kind: 'tokens', tokens: next }, 259);
    expect(Buffer.from((r.output as { logits: Float32Array }).logits.buffer).equals(Buffer.from((r2.output as { logits: Float32Array }).logits.buffer))).toBe(true);
    // rewinding past what the session holds is refused
    const err = await b.truncateSession('rolled', 261).catch((e: unknown) => e);
    expect(isMeshError(err) && err.code).toBe('POSITION_MISMATCH');
    await b.dispose();
    await source.close();
  });
});

describe('worker threads', () => {
  it('a two-thread engine gives the one-thread engine\'s logits bit for bit, prefill and decode', async () => {
    const source = await openTensorSource(await stories260K());
    const run = async (threads: number) => {
      const b = createNodeCpuBackend({ threads });
      await b.load(source, { start: 0, end: 5 });
      expect(b.threads).toBe(threads);
      await b.openSession('s', { contextLength: 64 });
      const out: Float32Array[] = [];
      let r = await b.forward('s', { kind: 'tokens', tokens: Int32Array.from([1, 403, 407, 261, 378]) }, 0);
      for (let i = 0; i < 4; i++) {
        if (r.output.kind !== 'logits') throw new Error('expected logits');
        out.push(r.output.logits);
        r = await b.forward('s', { kind: 'tokens', tokens: Int32Array.of(argmax(r.output.logits)) }, 5 + i);
      }
      await b.dispose();
      return out;
    };
    const one = await run(1);
    const two = await run(2);
    one.forEach((l, i) => expect(Buffer.from(two[i]!.buffer).equals(Buffer.from(l.buffer)), `step ${i}`).toBe(true));
    await source.close();
  });

  it('a kernel call that traps fails the job with CPU_WORKER_FAILED instead of hanging', () => {
    const arena = new WasmArena(1 << 16, { shared: true });
    arena.startThreads(1, nodeWorkers);
    const bad = Array.from({ length: 64 }, () => ({ fn: KERNEL_IDS.mm_f32, args: [0x7ff00000, 16, 0, 16, 0, 16, 4, 1, 0, 4] }));
    expect(codeOf(() => arena.run(bad))).toBe('CPU_WORKER_FAILED');
    arena.dispose();
  });
});

function codeOf(f: () => void): string | undefined {
  const e = catchIt(f);
  return isMeshError(e) ? e.code : e === undefined ? undefined : String(e);
}

describe('relaxed SIMD', () => {
  it('is on in Node (the fused multiply-add kernels run here as in production)', () => {
    expect(relaxedSimdAvailable()).toBe(true);
  });
});

describe('elementwise kernels', () => {
  it('swiglu in the arena equals the reference op to 2 ulp-ish (5e-7 relative), tail included', () => {
    const arena = new WasmArena(1 << 16);
    const n = 1003;
    const g = rand(n, 21).map((v) => v * 100); // past exp's f32 range on both sides
    const u = rand(n, 22);
    const ref = new Float32Array(n);
    swiglu(ref, g, u);
    const go = arena.alloc(n * 4);
    const uo = arena.alloc(n * 4);
    arena.f32(go, n).set(g);
    arena.f32(uo, n).set(u);
    swigluInArena(arena, arena.f32(go, n), arena.f32(uo, n));
    const got = arena.f32(go, n);
    for (let i = 0; i < n; i++) expect(Math.abs(got[i]! - ref[i]!)).toBeLessThanOrEqual(5e-7 * Math.abs(ref[i]!) + 1e-30);
  });
});
