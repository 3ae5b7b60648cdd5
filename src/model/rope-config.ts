// Rotary position embedding settings as llama.cpp derives them from GGUF metadata: the base,
// linear scaling, YaRN (llama-context.cpp's ext_factor / attn_factor / corr-dims inputs),
// llama3 or Phi-3 per-frequency factors, and Gemma 3's separate settings for its
// sliding-window layers. `ropeFor` picks the settings one layer uses in one session.

import { MeshError } from '../errors.ts';
import { metadataNumber } from '../gguf/metadata.ts';
import { GgmlType } from '../gguf/types.ts';
import type { MetadataValue, TensorSource } from '../gguf/types.ts';

export type RopeMode = 'normal' | 'neox';

export interface RopeConfig {
  /** 'normal' rotates adjacent pairs (2i, 2i+1); 'neox' rotates (i, i + n_rot/2) */
  mode: RopeMode;
  /** number of rotated dimensions per head (rope.dimension_count, default head_dim) */
  nRot: number;
  freqBase: number;
  /** linear scaling: positions are multiplied by freqScale (= 1 / rope.scaling.factor) */
  freqScale: number;
  /** YaRN's extrapolation mix: 1 for rope.scaling.type yarn, else 0 (off) */
  extFactor: number;
  /** magnitude factor cos/sin are multiplied by (YaRN's corrected mscale, rope.scaling.attn_factor) */
  attnFactor: number;
  betaFast: number;
  betaSlow: number;
  /** context the model was trained at before scaling (rope.scaling.original_context_length) */
  nCtxOrig: number;
  /**
   * per-frequency scaling factors, length nRot/2, or null: llama3's rope_freqs.weight, or
   * Phi-3's rope_factors_short/long. `configFromHeader` cannot read tensor data: it leaves this
   * null and names the tensor in `freqFactorsTensor`; `loadRopeFreqFactors` fills it in.
   */
  freqFactors: Float32Array | null;
  freqFactorsTensor: string | null;
}

/** The rope settings of a model's layers. */
export interface RopeSet {
  /** the global (full-attention) layers' rope */
  rope: RopeConfig;
  /** the sliding-window layers' rope (Gemma 3: rope.freq_base_swa, no scaling), or null */
  ropeSwa: RopeConfig | null;
  /** Phi-3 LongRoPE: the rope with rope_factors_long, for sessions past nCtxOrig; or null */
  ropeLong: RopeConfig | null;
  /** per layer: whether it attends through the sliding window */
  swaLayers: readonly boolean[];
}

/** The tensor that holds llama3-style RoPE frequency factors, when present. */
export const ROPE_FREQS_TENSOR = 'rope_freqs.weight';
const ROPE_LONG_TENSOR = 'rope_factors_long.weight';
const ROPE_SHORT_TENSOR = 'rope_factors_short.weight';
/** Tensors of per-frequency factors: every stage needs them, the rope tables read them on the host. */
export const ROPE_FACTOR_TENSORS: readonly string[] = [ROPE_FREQS_TENSOR, ROPE_SHORT_TENSOR, ROPE_LONG_TENSOR];

const f32 = Math.fround;
type Md = Record<string, MetadataValue>;

function num(md: Md, k: string): number | undefined {
  return metadataNumber(md[k]);
}

/** llama-context.cpp's get_mscale, in f32 */
function mscale(scale: number): number {
  return scale <= 1 ? 1 : f32(f32(f32(0.1) * f32(Math.log(scale))) + 1);
}

/**
 * The global layers' rope of architecture `arch` from its metadata. Throws
 * UNSUPPORTED_ROPE_SCALING for a scaling type llama.cpp's ggml_rope_ext cannot express here.
 */
export function ropeFromMetadata(md: Md, arch: string, mode: RopeMode, nRot: number, nCtxTrain: number, tensorNames: ReadonlySet<string>): RopeSet['rope'] {
  const key = (k: string) => `${arch}.${k}`;
  const type = md[key('rope.scaling.type')] ?? 'linear';
  if (type !== 'linear' && type !== 'none' && type !== 'yarn' && type !== 'longrope') {
    throw new MeshError('UNSUPPORTED_ROPE_SCALING', `rope scaling type '${String(type)}' is not supported (linear, none, yarn, longrope)`);
  }
  const factor = num(md, key('rope.scaling.factor')) ?? num(md, key('rope.scale_linear')) ?? 0;
  // f32 arithmetic, as llama.cpp stores it
  const freqScale = type === 'none' || factor === 0 ? 1 : f32(1 / factor);
  const extFactor = type === 'yarn' ? 1 : 0;
  let attnFactor = 1;
  if (extFactor !== 0) {
    // llama-context.cpp: mscale(factor), cancelled by the 1 + 0.1·ln(factor) ggml multiplies back in
    const s = f32(1 / freqScale);
    attnFactor = f32(mscale(s) * f32(1 / f32(1 + f32(f32(0.1) * f32(Math.log(s))))));
  }
  attnFactor = f32(attnFactor * f32(num(md, key('rope.scaling.attn_factor')) ?? 1));
  const freqTensor = tensorNames.has(ROPE_FREQS_TENSOR) ? ROPE_FREQS_TENSOR : tensorNames.has(ROPE_SHORT_TENSOR) ? ROPE_SHORT_TENSOR : null;
  return {
    mode,
    nRot,
    freqBase: f32(num(md, key('rope.freq_base')) ?? 10000),
    freqScale,
    extFactor,
    attnFactor,
    betaFast: 32,
    betaSlow: 1,
    nCtxOrig: num(md, key('rope.scaling.original_context_length')) ?? nCtxTrain,
    freqFactors: null,
    freqFactorsTensor: freqTensor,
  };
}

/** Phi-3's rope for long sessions (rope_factors_long), when the artifact has one. */
export function longRope(rope: RopeConfig, tensorNames: ReadonlySet<string>): RopeConfig | null {
  if (!tensorNames.has(ROPE_LONG_TENSOR)) return null;
  return { ...rope, freqFactors: null, freqFactorsTensor: ROPE_LONG_TENSOR };
}

/** Gemma 3's sliding-window layers: their own base (rope.freq_base_swa, default 10000) and no linear scaling. */
export function swaRope(md: Md, arch: string, rope: RopeConfig): RopeConfig {
  return { ...rope, freqBase: f32(num(md, `${arch}.rope.freq_base_swa`) ?? 10000), freqScale: 1, freqFactors: null, freqFactorsTensor: null };
}

/**
 * The rope layer `layer` uses in a session of `contextLength` positions. llama.cpp chooses
 * Phi-3's long factors when its context (padded to 256) exceeds the original context.
 */
export function ropeFor(set: RopeSet, layer: number, contextLength: number): RopeConfig {
  if (set.swaLayers[layer] && set.ropeSwa) return set.ropeSwa;
  if (set.ropeLong && Math.ceil(contextLength / 256) * 256 > set.rope.nCtxOrig) return set.ropeLong;
  return set.rope;
}

/** Reads the frequency-factor tensors the ropes name (rope_freqs, rope_factors_short/long). */
export async function loadRopeFreqFactors(set: RopeSet, source: TensorSource): Promise<void> {
  for (const rope of [set.rope, set.ropeLong]) {
    const name = rope?.freqFactorsTensor;
    if (!rope || !name || rope.freqFactors) continue;
    const info = source.header.tensors.find((t) => t.name === name);
    if (!info) throw new MeshError('TENSOR_MISSING', `${name} is named by the config but not in ${source.location}`);
    if (info.type !== GgmlType.F32 || info.nElements !== rope.nRot / 2) {
      throw new MeshError('BAD_MODEL_METADATA', `${name} must be F32 with ${rope.nRot / 2} elements`);
    }
    const bytes = (await source.read([info])).get(name)!;
    const copy = bytes.slice(); // aligned copy
    rope.freqFactors = new Float32Array(copy.buffer, copy.byteOffset, info.nElements);
  }
}
