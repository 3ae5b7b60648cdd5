// The CPU reference against llama.cpp on the architectures beyond the dense llama family —
// qwen3moe and qwen2moe (experts, shared expert), gemma3 (GeGLU, sliding window, post-norms,
// scaled embeddings, two rope bases), phi3 (fused QKV and gate/up, LongRoPE factors) — and on
// YaRN and llama3 rope_freqs; each in F32 and (the new architectures) in a Q4_K_M mix. Greedy
// tokens and prompt logits by the rules of test/support/oracle-check.ts; the hidden state
// after layer 1 equals llama.cpp's l_out-0 for F32.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { ARCH_CASES, NEW_ARCHS, PROMPT, QUANT_MIX } from './support/arch-cases.ts';
import { LlamaModelFfi } from './support/llamacpp-oracle.ts';
import { expectFirstLayerMatchesOracle, expectGreedyMatchesOracle } from './support/oracle-check.ts';
import { syntheticModel } from './support/synthetic.ts';

const N = 16;
const open: TensorSource[] = [];
afterAll(async () => {
  for (const s of open) await s.close();
});

async function check(label: string, options: Parameters<typeof syntheticModel>[0], exact: boolean, tolerance: number): Promise<void> {
  const path = await syntheticModel(options);
  const oracle = await LlamaModelFfi.load(path);
  const source = await openTensorSource(path);
  open.push(source);
  const cfg = configFromHeader(source.header);
  const stage = new CpuBackend();
  await stage.load(source, { start: 0, end: cfg.nLayer });
  const chain = new InProcessChain([stage]);
  try {
    const prompt = oracle.tokenize(PROMPT);
    await expectGreedyMatchesOracle(`cpu ${label}`, chain, oracle, prompt, N, { exact, tolerance });
    // hidden state after layer 1 (a first stage [0, 1)) equals llama.cpp's l_out-0
    if (exact) await expectFirstLayerMatchesOracle(source, oracle, prompt, 10 * tolerance);
  } finally {
    await chain.dispose();
    oracle.dispose();
  }
}

describe('CPU reference against llama.cpp', () => {
  it.each(ARCH_CASES)('$label, F32: greedy 16 tokens identical, logits and layer-0 output agree', async ({ label, options, tolerance }) => {
    await check(label, options, true, tolerance);
  });

  it.each(NEW_ARCHS)(`%s, ${QUANT_MIX}: greedy tokens agree`, async (arch) => {
    const c = ARCH_CASES.find((x) => x.options.arch === arch)!;
    await check(`${c.label} ${QUANT_MIX}`, { ...c.options, type: QUANT_MIX }, false, 0);
  });

  it('reads each feature from the metadata: experts, shared expert, window layers, rope variants', async () => {
    const cfgOf = async (o: Parameters<typeof syntheticModel>[0]) => {
      const s = await openTensorSource(await syntheticModel(o));
      open.push(s);
      return configFromHeader(s.header);
    };
    const [q3, q2, g, p, y] = await Promise.all(ARCH_CASES.slice(0, 5).map((c) => cfgOf(c.options)));
    expect(q3!.moe).toEqual({ nExpert: 4, nExpertUsed: 2, nFfExp: 256, normWeights: true, nFfShared: 0 });
    expect(q2!.moe).toEqual({ nExpert: 4, nExpertUsed: 2, nFfExp: 256, normWeights: false, nFfShared: 256 });
    expect(g!.swaLayers).toEqual([true, false]);
    expect(g!.ropeSwa!.freqBase).toBe(10000);
    expect(g!.rope.freqBase).toBe(1000000);
    expect(g!.embedScale).toBe(16);
    expect(g!.ffnActivation).toBe('gelu');
    expect(p!.ropeLong!.freqFactorsTensor).toBe('rope_factors_long.weight');
    expect(p!.rope.attnFactor).toBeGreaterThan(1);
    expect(y!.rope.extFactor).toBe(1);
    expect(y!.rope.freqScale).toBe(0.25);
    // YaRN's magnitude correction is cancelled by llama.cpp and reapplied inside the rope: ≈ 1
    expect(Math.abs(y!.rope.attnFactor - 1)).toBeLessThan(1e-6);
  });
});
