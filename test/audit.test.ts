// The audit of header-only GGUFs that mimic DeepSeek-V4-Flash, GLM-5.2 and Qwen3.5-35B-A3B at
// full size, and of the real stories260K: backend support, bytes per block, KV and hop bytes,
// boundary rules and shard plans. The expected numbers are the ones derived by hand in
// docs/audits/ from the published configs.

import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readHeader } from '../src/gguf/parse.ts';
import { GgmlType } from '../src/gguf/types.ts';
import type { GgufHeader } from '../src/gguf/types.ts';
import { writeGgufFile } from '../src/gguf/writer.ts';
import type { GgufSpec } from '../src/gguf/writer.ts';
import { auditHeader } from '../src/audit/report.ts';
import { planShards } from '../src/audit/plan.ts';
import type { PeerSpec } from '../src/audit/plan.ts';
import { modelGeometry } from '../src/audit/geometry.ts';
import { missingOps } from '../src/audit/ops.ts';
import { parseByteSize } from '../src/units.ts';
import { DS4, GLM, QWEN35, deepseek4Spec, glm52Full, glmDsaSpec, qwen35moeSpec } from './audit-fixtures.ts';
import { stories260K } from './support/models.ts';

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const Q4K = { matrix: GgmlType.Q4_K, experts: GgmlType.Q4_K };

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'audit-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Writes a header-only file, checks it stayed small, and reads its header back. */
async function headerOf(name: string, spec: GgufSpec): Promise<GgufHeader> {
  const path = join(dir, name);
  const layout = await writeGgufFile(path, spec);
  expect(statSync(path).size).toBe(layout.fileBytes);
  expect(layout.fileBytes).toBeLessThan(256 * 1024);
  return readHeader(path, { allowTruncatedData: true });
}

const peers = (n: number, memory: number, kind: PeerSpec['kind'] = 'browser'): PeerSpec[] =>
  Array.from({ length: n }, () => ({ kind, memory }));

describe('deepseek4 (DeepSeek-V4-Flash layout, Q4_K)', () => {
  let header: GgufHeader;
  beforeAll(async () => {
    header = await headerOf('ds4.gguf', deepseek4Spec(Q4K));
  });

  it('reads 43 blocks, 4 residual streams and the per-block bytes of the audit', () => {
    const r = auditHeader(header, 'ds4');
    expect(r.architecture).toBe('deepseek4');
    expect(r.n_layer).toBe(43);
    expect(r.hc_streams).toBe(4);
    // docs/audits/deepseek-v4-flash.md §2
    expect(r.layer_bytes[0]).toBe(3_708_678_616); // window layer with the tid2eid table
    expect(r.layer_bytes[2]).toBe(3_720_367_064); // CSA
    expect(r.layer_bytes[3]).toBe(3_708_200_408); // HCA
    const blocks = r.layer_bytes.reduce((a, b) => a + b, 0);
    expect(blocks / GiB).toBeCloseTo(148.68, 2);
    expect(r.largest_tensor).toEqual({ name: 'blk.0.ffn_gate_exps.weight', bytes: 1_207_959_552 });
  });

  it('computes 6,880 B/token of KV, a 5.375 MiB window and 32 KiB per hop', () => {
    const r = auditHeader(header, 'ds4');
    expect(r.kv_bytes_per_token).toBe(21 * 320 + 20 * 8);
    expect(r.kv_bytes_per_token_per_layer.slice(0, 4)).toEqual([0, 0, 320, 8]);
    expect(r.fixed_state_bytes).toBe(43 * 128 * 512 * 2);
    expect(r.hop_bytes_per_token).toBe(4 * 4096 * 2);
    expect(r.boundaries.token_id_blocks).toEqual([0, 1, 2]);
  });

  it('names the operations both backends lack and the I32 table they cannot read', () => {
    const r = auditHeader(header, 'ds4');
    for (const b of [r.backends.cpu, r.backends.webgpu]) {
      expect(b.ready).toBe(false);
      expect(b.architecture).toBe(false);
      expect(b.missing_ops).toEqual(expect.arrayContaining(['mhc_mixer', 'sinkhorn', 'kv_compressor', 'dsa_indexer', 'moe_hash_routing', 'attention_sinks', 'inverse_rope']));
      expect(b.missing_ops).not.toContain('rms_norm');
      expect(b.unsupported_types).toEqual(['I32']);
    }
    expect(r.backends.llamacpp.architecture).toBe(true);
    const types = Object.fromEntries(r.tensor_types.map((t) => [t.type, t]));
    expect(types.Q4_K!.webgpu).toBe(true);
    expect(types.I32!.tensors).toBe(3);
  });

  it('plans 15 × 16 GiB browser peers with the hash-routed blocks 0-2 in stage 0', () => {
    const r = auditHeader(header, 'ds4', { peers: peers(15, 16 * GiB) });
    const p = r.plan!;
    expect(p.feasible).toBe(true);
    expect(p.stages).toHaveLength(15);
    expect(p.stages[0]).toMatchObject({ start: 0, end: 3, holds_embedding: true });
    expect(p.stages.at(-1)).toMatchObject({ end: 43, holds_head: true });
    for (let i = 1; i < p.stages.length; i++) {
      expect(p.stages[i]!.start).toBe(p.stages[i - 1]!.end); // contiguous
      expect(p.stages[i]!.inbound_bytes_per_token).toBe(32_768);
    }
    expect(p.stages.every((s) => s.total_bytes <= s.budget_bytes)).toBe(true);
    expect(p.relaxed_starts).toBe(false);
    expect(p.stages[1]).toMatchObject({ start: 3, end: 6, kv_bytes: (8 + 320 + 8) * 4096, state_bytes: 3 * 128 * 512 * 2 });
    expect(p.wire_bytes_per_token).toBe(14 * 32_768);
    expect(p.runnable_now).toBe(false);
    // the 1.13 GiB expert tensors exceed the 128 MiB default binding: cut by rows into 10
    const split = p.stages[1]!.split_tensors.find((t) => t.name === 'blk.3.ffn_gate_exps.weight');
    expect(split).toEqual({ name: 'blk.3.ffn_gate_exps.weight', bytes: 1_207_959_552, pieces: 10 });
    expect(p.stages[1]!.blockers.join('\n')).toMatch(/WGSL lacks: .*mhc_mixer/);
  });

  it('says why 14 × 16 GiB peers cannot hold it, and why 8 GiB peers cannot hold a block', () => {
    const p14 = planShards(modelGeometry(header), peers(14, 16 * GiB));
    expect(p14.feasible).toBe(false);
    expect(p14.reason).toMatch(/no contiguous assignment/);
    const tiny = planShards(modelGeometry(header), peers(60, 4 * GiB));
    expect(tiny.feasible).toBe(false);
    expect(tiny.reason).toMatch(/block 0 alone needs 3\.7\d GiB .* largest peer may use 3\.00 GiB/);
  });

  it('forwards token ids when 8 GiB peers force a cut inside blocks 0-2', () => {
    const p = auditHeader(header, 'ds4', { peers: peers(43, 8 * GiB) }).plan!;
    expect(p.feasible).toBe(true);
    expect(p.relaxed_starts).toBe(true);
    const inside = p.stages.filter((s) => s.start > 0 && s.start <= 2);
    expect(inside.length).toBeGreaterThan(0);
    for (const s of inside) {
      expect(s.needs_token_ids).toBe(true);
      expect(s.inbound_bytes_per_token).toBe(32_768 + 4);
    }
  });

  it('blocks native llama.cpp peers from taking the 4-stream state mid-route', () => {
    const mix: PeerSpec[] = [
      { kind: 'native', memory: 64 * GiB },
      ...peers(4, 24 * GiB),
      { kind: 'native', memory: 64 * GiB },
    ];
    const p = auditHeader(header, 'ds4', { peers: mix }).plan!;
    expect(p.feasible).toBe(true);
    expect(p.stages.map((s) => [s.start, s.end])).toEqual([[0, 13], [13, 18], [18, 22], [22, 26], [26, 30], [30, 43]]);
    expect(p.stages.at(-1)!.blockers.join('\n')).toMatch(/not the 4-stream hyper-connection state/);
    expect(p.stages[0]!.blockers.join('\n')).toMatch(/as the whole model only; its layer-range path runs llama, qwen2, qwen3/);
    expect(p.stages[0]!.split_tensors).toEqual([]); // native peers have no binding limit
    expect(p.stages.map((s) => s.backend)).toEqual(['llamacpp', 'webgpu', 'webgpu', 'webgpu', 'webgpu', 'llamacpp']);
  });

  it('also reads the MXFP4-experts layout of the released checkpoint', async () => {
    const h = await headerOf('ds4-mxfp4.gguf', deepseek4Spec({ matrix: GgmlType.Q8_0, experts: GgmlType.MXFP4 }));
    const r = auditHeader(h, 'ds4-mxfp4');
    const mx = r.tensor_types.find((t) => t.type === 'MXFP4')!;
    expect(mx.tensors).toBe(3 * 43);
    expect(mx.bytes).toBe(3 * 43 * ((DS4.nEmbd * DS4.nFf * DS4.nExpert) / 32) * 17);
    // both engines read MXFP4 since issue 20
    expect([mx.cpu, mx.webgpu, mx.llamacpp]).toEqual([true, true, true]);
  });
});

describe('glm-dsa (GLM-5.2 layout, Q4_K)', () => {
  let header: GgufHeader;
  beforeAll(async () => {
    header = await headerOf('glm.gguf', glmDsaSpec(Q4K, 'key'));
  });

  it('separates the MTP block and finds the 21 full-indexer layers', () => {
    const r = auditHeader(header, 'glm');
    expect(r.n_layer).toBe(78);
    expect(r.n_layer_nextn).toBe(1);
    expect(r.mtp_bytes).toBeGreaterThan(5 * GiB);
    const full = r.boundaries.free_starts!;
    expect(full).toHaveLength(21);
    expect(full.slice(0, 6)).toEqual([0, 1, 2, 6, 10, 14]);
    expect(full.at(-1)).toBe(74);
    expect(r.boundaries.start_penalty_bytes_per_token).toBe(2048 * 4);
  });

  it('computes 95,232 B/token of KV and 12 KiB per hop', () => {
    const r = auditHeader(header, 'glm');
    expect(r.kv_bytes_per_token).toBe(78 * 1152 + 21 * 256);
    expect(r.hop_bytes_per_token).toBe(6144 * 2);
    expect(r.layer_bytes[0]).toBe(229_379_072);
    expect(r.layer_bytes[3]).toBe(5_559_372_800);
    expect(r.layer_bytes[6]).toBe(5_565_321_216);
    expect(r.backends.webgpu.missing_ops).toEqual(expect.arrayContaining(['mla_attention', 'dsa_indexer', 'index_share', 'top_k_sparse_mask']));
  });

  it('starts every stage on a full-indexer layer when 32 GiB peers allow it', () => {
    const p = auditHeader(header, 'glm', { peers: peers(19, 32 * GiB) }).plan!;
    expect(p.feasible).toBe(true);
    expect(p.relaxed_starts).toBe(false);
    for (const s of p.stages) expect(s.start === 0 || glm52Full(s.start)).toBe(true);
    expect(p.stages.every((s) => s.inbound_bytes_per_token === 0 || s.inbound_bytes_per_token === 12_288)).toBe(true);
  });

  it('ships the top-k when 16 GiB peers cannot hold a 4-block group', () => {
    const p = auditHeader(header, 'glm', { peers: peers(38, 16 * GiB) }).plan!;
    expect(p.feasible).toBe(true);
    expect(p.relaxed_starts).toBe(true);
    const shared = p.stages.filter((s) => s.needs_start_penalty);
    expect(shared.length).toBeGreaterThan(0);
    for (const s of shared) {
      expect(glm52Full(s.start)).toBe(false);
      expect(s.inbound_bytes_per_token).toBe(12_288 + 8_192);
    }
    expect(p.fewest_stages!.stages).toBe(38);
  });

  it('applies the GLM-5.2 schedule to a 1M-context file without indexer.types, and all-full to a 5.1 file', async () => {
    const dflt = auditHeader(await headerOf('glm-default.gguf', glmDsaSpec(Q4K, 'default')), 'glm-default');
    expect(dflt.boundaries.free_starts).toHaveLength(21);
    const v51 = auditHeader(await headerOf('glm-51.gguf', glmDsaSpec(Q4K, 'all-full')), 'glm-51');
    expect(v51.boundaries.free_starts).toBeNull();
    expect(v51.kv_bytes_per_token).toBe(78 * (1152 + 256));
  });
});

describe('qwen35moe (Qwen3.5-35B-A3B / Ornith-35B layout, Q4_K)', () => {
  let header: GgufHeader;
  beforeAll(async () => {
    header = await headerOf('qwen.gguf', qwen35moeSpec(Q4K));
  });

  it('counts KV only on the 10 attention blocks and f32 state on the 30 DeltaNet blocks', () => {
    const r = auditHeader(header, 'qwen');
    expect(r.n_layer).toBe(QWEN35.nLayer);
    expect(r.kv_bytes_per_token).toBe(10 * 2 * 256 * 2 * 2);
    expect(r.kv_bytes_per_token_per_layer.slice(0, 4)).toEqual([0, 0, 0, 2048]);
    expect(r.fixed_state_bytes).toBe(30 * ((4 - 1) * 8192 + 128 * 128 * 32) * 4);
    expect(r.hop_bytes_per_token).toBe(4096);
    expect(r.layer_bytes[0]).toBe(476_406_528);
    expect(r.layer_bytes[3]).toBe(472_213_504);
    // the CPU reference and the WGSL kernels both run Qwen3.5's blocks (issue 21)
    expect(r.backends.cpu.missing_ops).toEqual([]);
    expect(r.backends.webgpu.missing_ops).toEqual([]);
  });

  it('fits 2 × 16 GiB peers but not one 24 GiB peer', () => {
    const two = auditHeader(header, 'qwen', { peers: peers(2, 16 * GiB) }).plan!;
    expect(two.feasible).toBe(true);
    expect(two.stages.map((s) => [s.start, s.end])).toEqual([[0, 20], [20, 40]]);
    const one = auditHeader(header, 'qwen', { peers: peers(1, 24 * GiB) }).plan!;
    expect(one.feasible).toBe(false);
    expect(one.reason).toMatch(/needs 18\.\d+ GiB .* may use 18\.00 GiB/);
  });
});

describe('stories260K (llama, fully supported)', () => {
  let header: GgufHeader;
  beforeAll(async () => {
    header = await readHeader(await stories260K());
  });

  it('is ready on every backend', () => {
    const r = auditHeader(header, 'stories');
    expect(r.n_layer).toBe(5);
    for (const b of Object.values(r.backends)) expect(b.ready).toBe(true);
    expect(r.ops.every((o) => o.cpu && o.webgpu)).toBe(true);
    expect(r.kv_bytes_per_token).toBe(5 * 4 * (8 + 8) * 2);
    expect(r.hop_bytes_per_token).toBe(128);
  });

  it.each([1, 2, 3, 4, 5])('plans %i peer(s): contiguous, one stage per peer, runnable now', (n) => {
    const p = auditHeader(header, 'stories', { peers: peers(n, 8 * MiB) }).plan!;
    expect(p.feasible).toBe(true);
    expect(p.stages).toHaveLength(n);
    expect(p.stages[0]!.start).toBe(0);
    expect(p.stages.at(-1)!.end).toBe(5);
    for (let i = 1; i < n; i++) expect(p.stages[i]!.start).toBe(p.stages[i - 1]!.end);
    expect(p.runnable_now).toBe(true);
    expect(p.unused_peers).toEqual([]);
    expect(p.wire_bytes_per_token).toBe((n - 1) * 128);
  });

  it('runs a whole model and a layer range on native llama.cpp peers', () => {
    const whole = auditHeader(header, 'stories', { peers: peers(1, 8 * MiB, 'native') }).plan!;
    expect(whole.stages.map((s) => s.backend)).toEqual(['llamacpp']);
    const split = auditHeader(header, 'stories', { peers: [...peers(1, 8 * MiB), ...peers(1, 8 * MiB, 'native')] }).plan!;
    expect(split.stages.map((s) => s.backend)).toEqual(['webgpu', 'llamacpp']);
    expect(split.runnable_now).toBe(true);
  });

  it('needs a native peer when a single row exceeds the browser binding limit', () => {
    const tiny = { maxBindingBytes: 128 };
    const browsers = auditHeader(header, 'stories', { peers: peers(2, 8 * MiB), plan: tiny }).plan!;
    expect(browsers.feasible).toBe(false);
    expect(browsers.reason).toMatch(/row exceeds the browser binding limit.*add a native peer/);
    const mixed = auditHeader(header, 'stories', { peers: [...peers(1, 8 * MiB), ...peers(1, 8 * MiB, 'native')], plan: tiny }).plan!;
    expect(mixed.feasible).toBe(true);
    expect(mixed.stages.map((s) => s.kind)).toEqual(['native']);
    expect(mixed.unused_peers).toEqual([0]);
  });

  it('leaves the sixth of six peers unused and refuses peers too small for one block', () => {
    const six = auditHeader(header, 'stories', { peers: peers(6, 8 * MiB) }).plan!;
    expect(six.stages).toHaveLength(5);
    expect(six.unused_peers).toHaveLength(1);
    const small = auditHeader(header, 'stories', { peers: peers(5, 256 * 1024) }).plan!;
    expect(small.feasible).toBe(false);
    expect(small.reason).toMatch(/block 0 alone needs/);
  });
});

describe('the peer-count tables in docs/audits/', () => {
  const fewest = (header: GgufHeader, gib: number) => planShards(modelGeometry(header), peers(100, gib * GiB), {}, 'fewest');

  it('DeepSeek-V4-Flash Q4_K: 15 / 9 / 8 / 4 / 2 peers of 16 / 24 / 32 / 64 / 128 GiB', async () => {
    const h = await headerOf('ds4-table.gguf', deepseek4Spec(Q4K));
    expect([16, 24, 32, 64, 128].map((m) => fewest(h, m).stages.length)).toEqual([15, 9, 8, 4, 2]);
    expect(fewest(h, 8).stages.length).toBe(43);
    expect(fewest(h, 8).relaxedStarts).toBe(true); // one block per peer: blocks 1 and 2 start stages
  });

  it('GLM-5.2 Q4_K: full-layer starts need 19 × 32 GiB, 19 × 48 GiB, 10 × 64 GiB; 16 GiB only with shipped top-k', async () => {
    const h = await headerOf('glm-table.gguf', glmDsaSpec(Q4K, 'key'));
    const p16 = fewest(h, 16);
    expect([p16.stages.length, p16.relaxedStarts]).toEqual([38, true]);
    for (const [m, n] of [[32, 19], [48, 19], [64, 10], [128, 5]] as const) {
      const p = fewest(h, m);
      expect([m, p.stages.length, p.relaxedStarts]).toEqual([m, n, false]);
    }
  });

  it('Ornith-35B Q4_K: 4 × 8 GiB, 2 × 16 GiB, 2 × 24 GiB, 1 × 32 GiB', async () => {
    const h = await headerOf('qwen-table.gguf', qwen35moeSpec(Q4K));
    expect([8, 16, 24, 32].map((m) => fewest(h, m).stages.length)).toEqual([4, 2, 2, 1]);
  });
});

describe('units and tables', () => {
  it('parses sizes people type', () => {
    expect(parseByteSize('16GiB')).toBe(16 * GiB);
    expect(parseByteSize('1.5 GiB')).toBe(1.5 * GiB);
    expect(parseByteSize('8GB')).toBe(8e9);
    expect(parseByteSize('4096')).toBe(4096);
    expect(parseByteSize('16 apples')).toBeUndefined();
    expect(parseByteSize('-1GiB')).toBeUndefined();
  });

  it('has no op table for an unknown architecture rather than guessing', () => {
    expect(missingOps('made-up-arch', 'cpu')).toBeUndefined();
    expect(missingOps('llama', 'webgpu')).toEqual([]);
    expect(GLM.nLayer).toBe(78);
  });
});
