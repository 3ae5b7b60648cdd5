// The synthetic models every engine is checked on against llama.cpp for the architectures and
// rope variants beyond the dense llama/qwen2/qwen3 of test/cpu-synthetic.test.ts: tiny shapes
// (2 layers, n_embd 256, 4 heads / 2 KV heads) that still exercise each feature — MoE routing
// over 4 experts with 2 active, Gemma 3's sliding window (8 positions, layer 0 of 2 slides)
// against a 20-odd-token prompt, Phi-3's long factors (original context 64 < the padded 256),
// YaRN with an original context small enough that its ramp covers several frequencies.
import type { MakeModelOptions } from '../../src/model/synthetic-model.ts';

const BASE: MakeModelOptions = { layers: 2, embd: 256, heads: 4, kvHeads: 2, ffn: 512 };

export interface ArchCase {
  label: string;
  options: MakeModelOptions;
  /** max |prompt logit − llama.cpp's| for f32 weights (GeGLU's f16 table leaves more) */
  tolerance: number;
}

/** Each new architecture and rope variant, in F32. */
export const ARCH_CASES: ArchCase[] = [
  { label: 'qwen3moe', options: { ...BASE, arch: 'qwen3moe', expertFfn: 256 }, tolerance: 1e-5 },
  { label: 'qwen2moe', options: { ...BASE, arch: 'qwen2moe', expertFfn: 256, sharedFfn: 256 }, tolerance: 1e-5 },
  { label: 'gemma3', options: { ...BASE, arch: 'gemma3', slidingWindow: 8, swaPattern: 2 }, tolerance: 1e-4 },
  { label: 'phi3 (long rope factors)', options: { ...BASE, arch: 'phi3', ropeOrigCtx: 64 }, tolerance: 1e-5 },
  { label: 'qwen3 with YaRN', options: { ...BASE, arch: 'qwen3', ropeScaling: 'yarn', ropeOrigCtx: 64 }, tolerance: 1e-5 },
  { label: 'llama with llama3 rope_freqs', options: { ...BASE, arch: 'llama', ropeFreqs: true }, tolerance: 1e-5 },
];

/** The quantised mix each new architecture is also checked in (Q4_K with Q6_K, as llama.cpp's Q4_K_M). */
export const QUANT_MIX = 'q4_k_m' as const;
export const NEW_ARCHS = ['qwen3moe', 'qwen2moe', 'gemma3', 'phi3'] as const;

export const PROMPT = 'The quick brown fox jumps over the lazy dog. It was';
