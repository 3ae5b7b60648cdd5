// The Qwen3.5 family's hybrid layout as llama.cpp reads it (src/models/qwen35.cpp,
// qwen35moe.cpp `load_arch_hparams`): which blocks are Gated DeltaNet linear attention
// (recurrent) and which are gated full attention, the DeltaNet shapes from the `ssm.*` keys,
// and the multi-section rope ("IMRoPE") that text positions reduce to a plain NeoX rope of
// rope.dimension_count dimensions.

import { MeshError } from '../errors.ts';
import { metadataNumber } from '../gguf/metadata.ts';
import type { MetadataValue } from '../gguf/types.ts';

type Md = Record<string, MetadataValue>;

/** Shapes of a Gated DeltaNet block (per layer the same). */
export interface LinearAttentionConfig {
  /** width of the causal depthwise conv over q|k|v (ssm.conv_kernel) */
  convKernel: number;
  /** size of one q/k head and one v head (ssm.state_size): the state is headDim × headDim per v head */
  headDim: number;
  /** q/k heads (ssm.group_count) */
  nKHeads: number;
  /** v heads (ssm.time_step_rank); v head h reads q/k head h mod nKHeads */
  nVHeads: number;
  /** channels the conv runs over: 2·nKHeads·headDim + nVHeads·headDim */
  convChannels: number;
}

/** What the hybrid architectures add to ModelConfig. */
export interface HybridConfig {
  linearAttention: LinearAttentionConfig | null;
  /** per layer: a Gated DeltaNet block (true) or full attention (false) */
  recurrentLayers: readonly boolean[];
  /** full attention: q projection twice as wide, its second half gates the output through a sigmoid */
  attnOutputGate: boolean;
}

export const HYBRID_ARCHITECTURES = ['qwen35', 'qwen35moe'] as const;

export const NOT_HYBRID: HybridConfig = { linearAttention: null, recurrentLayers: [], attnOutputGate: false };

function int(md: Md, k: string): number {
  const n = metadataNumber(md[k]);
  if (n === undefined || !Number.isSafeInteger(n) || n <= 0) throw new MeshError('BAD_MODEL_METADATA', `${k} is missing or not a positive integer`);
  return n;
}

/** The hybrid settings of a qwen35/qwen35moe header (other architectures: NOT_HYBRID). */
export function hybridConfig(md: Md, arch: string, nLayer: number, nRot: number): HybridConfig {
  if (!(HYBRID_ARCHITECTURES as readonly string[]).includes(arch)) return { ...NOT_HYBRID, recurrentLayers: new Array<boolean>(nLayer).fill(false) };
  const key = (k: string) => `${arch}.${k}`;
  const headDim = int(md, key('ssm.state_size'));
  const nKHeads = int(md, key('ssm.group_count'));
  const nVHeads = int(md, key('ssm.time_step_rank'));
  const inner = int(md, key('ssm.inner_size'));
  if (inner !== nVHeads * headDim) {
    throw new MeshError('BAD_MODEL_METADATA', `${key('ssm.inner_size')} ${inner} != time_step_rank ${nVHeads} × state_size ${headDim}`);
  }
  if (nVHeads % nKHeads !== 0) throw new MeshError('BAD_MODEL_METADATA', `ssm.time_step_rank ${nVHeads} is not a multiple of ssm.group_count ${nKHeads}`);
  checkTextRope(md, key('rope.dimension_sections'), nRot);
  return {
    linearAttention: { convKernel: int(md, key('ssm.conv_kernel')), headDim, nKHeads, nVHeads, convChannels: 2 * nKHeads * headDim + nVHeads * headDim },
    recurrentLayers: recurrentLayers(md, arch, nLayer),
    attnOutputGate: true,
  };
}

/** attention.recurrent_layers when written (a trimmed file must), else every (i+1) % interval != 0. */
function recurrentLayers(md: Md, arch: string, nLayer: number): boolean[] {
  const explicit = md[`${arch}.attention.recurrent_layers`];
  if (Array.isArray(explicit)) {
    if (explicit.length < nLayer) throw new MeshError('BAD_MODEL_METADATA', `${arch}.attention.recurrent_layers has ${explicit.length} entries for ${nLayer} layers`);
    return explicit.slice(0, nLayer).map((v) => Boolean(typeof v === 'bigint' ? v !== 0n : v));
  }
  const interval = metadataNumber(md[`${arch}.full_attention_interval`]) ?? 4;
  if (!Number.isSafeInteger(interval) || interval <= 0) throw new MeshError('BAD_MODEL_METADATA', `${arch}.full_attention_interval must be a positive integer`);
  return Array.from({ length: nLayer }, (_, i) => (i + 1) % interval !== 0);
}

/**
 * llama.cpp gives text tokens the same position in the t/h/w sections and 0 in the 4th; with
 * interleaved sections a rotated pair reads the 4th (angle 0) only past 3·section. We run the
 * plain NeoX rope, so refuse sections under which some rotated pair would read the 4th.
 */
function checkTextRope(md: Md, k: string, nRot: number): void {
  const v = md[k];
  if (!Array.isArray(v)) return;
  const s = v.map((x) => Number(metadataNumber(x as MetadataValue) ?? 0));
  const dims = s.reduce((a, b) => a + b, 0);
  if (dims === 0) return;
  for (let i = 0; i < nRot / 2; i++) {
    const sector = i % dims;
    const text = (sector % 3 === 0 && sector < 3 * s[0]!) || (sector % 3 === 1 && sector < 3 * s[1]!) || (sector % 3 === 2 && sector < 3 * s[2]!);
    if (!text) throw new MeshError('UNSUPPORTED_ROPE_SCALING', `${k} [${s.join(', ')}] leaves rotated pair ${i} on the 4th (vision) section, which is not supported`);
  }
}
