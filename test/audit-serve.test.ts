// `audit` and `serve` agree on which models run: for each new architecture (accepted), and for
// models serve refuses (an unknown architecture, a rope scaling no engine computes), the audit's
// serve check matches what a real signaling server does when given the file — its code too —
// and every backend is ready exactly when serve accepts. On a MoE model the audit counts the
// expert bytes and what one decoded token reads of them.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { configFromHeader } from '../src/model/config.ts';
import { startSignalingServer } from '../signaling-server/server.ts';
import { auditHeader } from '../src/audit/report.ts';
import { isMeshError } from '../src/errors.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { isExpertTensor, tensorGroups } from '../src/gguf/summary.ts';
import { writeGgufFile } from '../src/gguf/writer.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { syntheticModelSpec } from '../src/model/synthetic-model.ts';
import { ARCH_CASES } from './support/arch-cases.ts';
import { syntheticModel } from './support/synthetic.ts';

const dir = mkdtempSync(join(tmpdir(), 'audit-serve-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A small llama model with its metadata edited: `arch` renames the architecture (and its keys). */
async function edited(name: string, options: MakeModelOptions, arch: string | null, extra: Record<string, string>): Promise<string> {
  const base = syntheticModelSpec(options);
  const spec = { ...base, metadata: base.metadata.map((m) => ({ ...m })) };
  for (const m of spec.metadata) {
    if (arch && m.key === 'general.architecture') m.value = arch;
    else if (arch && m.key.startsWith('llama.')) m.key = `${arch}.${m.key.slice('llama.'.length)}`;
  }
  for (const [key, value] of Object.entries(extra)) spec.metadata.push({ key: `${arch ?? 'llama'}.${key}`, type: 'string', value });
  const path = join(dir, name);
  await writeGgufFile(path, spec);
  return path;
}

async function serveOutcome(path: string): Promise<string | null> {
  try {
    const server = await startSignalingServer({ port: 0, models: [path], log: () => undefined });
    await server.close();
    return null;
  } catch (e) {
    if (!isMeshError(e)) throw e;
    return e.code;
  }
}

const SMALL: MakeModelOptions = { layers: 1, embd: 64, heads: 2, ffn: 64, vocab: 600 };

describe('audit and serve agree', () => {
  const cases: [string, () => Promise<string>][] = [
    ...ARCH_CASES.slice(0, 4).map((c): [string, () => Promise<string>] => [c.label, () => syntheticModel(c.options)]),
    ['gemma2 (an architecture no engine here runs)', () => edited('gemma2.gguf', SMALL, 'gemma2', {})],
    ['llama with ntk-by-parts rope scaling', () => edited('ntk.gguf', SMALL, null, { 'rope.scaling.type': 'ntk-by-parts' })],
  ];
  it.each(cases)('%s', async (_label, make) => {
    const path = await make();
    const report = auditHeader(await readHeader(path), path);
    const refused = await serveOutcome(path);
    expect(report.serve.accepted).toBe(refused === null);
    expect(report.serve.code).toBe(refused);
    // refused by serve: ready nowhere, the code in the notes
    if (refused) {
      for (const b of Object.values(report.backends)) expect(b.ready, JSON.stringify(b)).toBe(false);
      expect(report.backends.llamacpp.notes.join(' ')).toContain(refused);
      return;
    }
    // served: the CPU and WebGPU engines are ready exactly where their config takes the model
    const engine = await (async () => {
      try {
        configFromHeader(await readHeader(path));
        return null;
      } catch (e) {
        return (e as { code: string }).code;
      }
    })();
    for (const b of [report.backends.cpu, report.backends.webgpu]) {
      if (engine) expect(b.ready, JSON.stringify(b)).toBe(false);
      if (engine) expect(b.notes.join(' ')).toContain(engine);
    }
    expect(Object.values(report.backends).some((b) => b.ready), JSON.stringify(report.backends)).toBe(true);
  });

  it('counts a MoE model\'s expert bytes in its shard groups, and what a decoded token reads of them', async () => {
    const c = ARCH_CASES.find((x) => x.options.arch === 'qwen3moe')!;
    const header = await readHeader(await syntheticModel(c.options));
    const r = auditHeader(header, 'qwen3moe');
    const experts = header.tensors.filter((t) => isExpertTensor(t.name));
    expect(experts.map((t) => t.name)).toContain('blk.1.ffn_down_exps.weight');
    const expertBytes = experts.reduce((a, t) => a + t.byteLength, 0);
    expect(r.expert_bytes).toBe(expertBytes);
    // the layer shard units hold every expert
    const groups = tensorGroups(header, 2);
    expect(groups.find((g) => g.name === 'layer.0')!.tensors).toContain('blk.0.ffn_gate_exps.weight');
    expect(groups.filter((g) => g.name.startsWith('layer.')).reduce((a, g) => a + g.bytes, 0)).toBe(r.layer_bytes.reduce((a, b) => a + b, 0));
    // 2 of 4 experts per token: a token reads half the expert bytes plus everything else
    const others = header.tensors.filter((t) => !isExpertTensor(t.name) && t.name !== 'token_embd.weight').reduce((a, t) => a + t.byteLength, 0);
    const embedRow = header.tensors.find((t) => t.name === 'token_embd.weight')!.byteLength / 1024;
    expect(r.active_weight_bytes_per_token).toBe(Math.round(others + expertBytes / 2 + embedRow));
  });

  it('cuts expert tensors for a browser stage into whole experts, and needs one expert to fit a binding', async () => {
    const c = ARCH_CASES.find((x) => x.options.arch === 'qwen3moe')!;
    const header = await readHeader(await syntheticModel(c.options));
    // F32 [256, 256, 4]: 1 MiB per tensor, 256 KiB per expert
    const browser = [{ kind: 'browser' as const, memory: 1 << 30 }];
    const fits = auditHeader(header, 'q', { peers: browser, plan: { maxBindingBytes: 300 * 1024 } });
    expect(fits.plan!.feasible).toBe(true);
    const gate = fits.plan!.stages[0]!.split_tensors.find((t) => t.name === 'blk.0.ffn_gate_exps.weight');
    expect(gate).toEqual({ name: 'blk.0.ffn_gate_exps.weight', bytes: 1 << 20, pieces: 4 });
    const tooSmall = auditHeader(header, 'q', { peers: browser, plan: { maxBindingBytes: 200 * 1024 } });
    expect(tooSmall.plan!.feasible).toBe(false);
    expect(tooSmall.plan!.reason).toMatch(/binding limit/);
  });
});
