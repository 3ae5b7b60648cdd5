// GeGLU as ggml's CPU backend computes it (GGML_GELU_FP16): the gate is rounded to f16 and
// looked up in a table of tanh-approximated GELU values that are themselves rounded to f16
// (|x| ≥ 10 passes through or gives 0). Reproducing that table is what keeps a Gemma model's
// greedy tokens equal to llama.cpp's; an exact GELU differs by up to an f16 step per element.

import { F16_TABLE, f32ToF16 } from '../../gguf/fp16.ts';

const f32 = Math.fround;
const GELU_COEF_A = f32(0.044715);
const SQRT_2_OVER_PI = f32(0.7978845608028654);

/** ggml_gelu_f32: 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))), step by step in f32 */
export function geluF32(x: number): number {
  const inner = f32(f32(SQRT_2_OVER_PI * x) * f32(1 + f32(f32(GELU_COEF_A * x) * x)));
  return f32(f32(f32(0.5) * x) * f32(1 + f32(Math.tanh(inner))));
}

/** GELU of every f16 value, rounded to f16 and widened back: [65536] f32 (ggml_table_gelu_f16). */
export const GELU_F16_TABLE: Float32Array = (() => {
  const t = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) t[i] = F16_TABLE[f32ToF16(geluF32(F16_TABLE[i]!))]!;
  return t;
})();

/** GELU of one activation the way ggml_vec_geglu_f32 takes it (before multiplying by up). */
export function geluGgml(x: number): number {
  if (x <= -10) return 0;
  if (x >= 10) return x;
  return GELU_F16_TABLE[f32ToF16(x)]!;
}

/** GeGLU: out = gelu(gate) ⊙ up, as ggml. gate, up, out: same length (out may alias gate) */
export function geglu(out: Float32Array, gate: Float32Array, up: Float32Array): void {
  for (let i = 0; i < out.length; i++) out[i] = geluGgml(gate[i]!) * up[i]!;
}
