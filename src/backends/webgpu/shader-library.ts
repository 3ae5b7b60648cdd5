// WGSL sources by name ("mul_mat_vec", "quant/q4_k", …) and how a kernel is assembled from
// them: kernels that read GGUF weights get the byte helpers and one quant-type snippet
// (defining `dequant4`) prepended, so one kernel body serves every supported type; kernels
// that reduce across a workgroup get a reduce/ snippet, attention a kv/ snippet, and the
// batched matmuls their shared Params and bindings (matmul/batched_io).

import { MeshError } from '../../errors.ts';
import { GgmlType } from '../../gguf/types.ts';

/** file name under shaders/ without ".wgsl" → WGSL source */
export type ShaderSources = Readonly<Record<string, string>>;

/** Weight encodings with a dequant snippet in shaders/quant/. */
export type QuantKind =
  | 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q4_0' | 'q4_1' | 'q5_0' | 'q5_1'
  | 'q2_k' | 'q3_k' | 'q4_k' | 'q5_k' | 'q6_k' | 'iq4_nl' | 'iq4_xs' | 'mxfp4';

export const QUANT_OF_TYPE: Partial<Record<GgmlType, QuantKind>> = {
  [GgmlType.F32]: 'f32',
  [GgmlType.F16]: 'f16',
  [GgmlType.BF16]: 'bf16',
  [GgmlType.Q8_0]: 'q8_0',
  [GgmlType.Q4_0]: 'q4_0',
  [GgmlType.Q4_1]: 'q4_1',
  [GgmlType.Q5_0]: 'q5_0',
  [GgmlType.Q5_1]: 'q5_1',
  [GgmlType.Q2_K]: 'q2_k',
  [GgmlType.Q3_K]: 'q3_k',
  [GgmlType.Q4_K]: 'q4_k',
  [GgmlType.Q5_K]: 'q5_k',
  [GgmlType.Q6_K]: 'q6_k',
  [GgmlType.IQ4_NL]: 'iq4_nl',
  [GgmlType.IQ4_XS]: 'iq4_xs',
  [GgmlType.MXFP4]: 'mxfp4',
};

export const SUPPORTED_WEIGHT_TYPES: readonly GgmlType[] = Object.keys(QUANT_OF_TYPE).map(Number) as GgmlType[];

export function quantKindOf(type: GgmlType, what: string): QuantKind {
  const q = QUANT_OF_TYPE[type];
  if (!q) {
    throw new MeshError('UNSUPPORTED_TENSOR_TYPE', `${what} has type ${GgmlType[type] ?? type}, which the WebGPU kernels cannot read (supported: ${SUPPORTED_WEIGHT_TYPES.map((t) => GgmlType[t]).join(', ')})`);
  }
  return q;
}

/** Element type of a KV cache (a shaders/kv/ snippet). */
export type KvType = 'f32' | 'f16';

/** Kernels that read the KV cache through a shaders/kv/ snippet chosen by their type variant. */
export const KV_KERNELS: ReadonlySet<string> = new Set(['attention_decode', 'attention_prefill']);

/** Kernels that call `workgroup_sum` and take the adapter's shaders/reduce/ snippet. */
export const REDUCING_KERNELS: ReadonlySet<string> = new Set(['mul_mat_vec', 'mul_mat_vec_id', 'rms_norm']);

/**
 * Kernels that call `workgroup_max` / `workgroup_sum` and always take reduce/shared: their
 * sums then add up in one order on every adapter (a subgroup sum would reorder them).
 */
export const TREE_REDUCING_KERNELS: ReadonlySet<string> = new Set(['softmax', 'attention_decode', 'attention_prefill']);

/** Kernels whose Params struct and bindings are shaders/matmul/batched_io.wgsl. */
export const BATCHED_MATMUL_KERNELS: ReadonlySet<string> = new Set(['mul_mat', 'mul_mat_tiled']);

export type ReduceKind = 'shared' | 'subgroup';

/**
 * The full WGSL of `kernel`, specialised by its type variant — the GGUF weight type of kernels
 * that read weights, the KV element type of attention kernels — with the `reduce` snippet
 * when it sums across a workgroup (reduce/shared for TREE_REDUCING_KERNELS), and with the
 * batched matmuls' shared prologue. `enable` directives move to the top, where WGSL wants them.
 */
export function assembleShader(sources: ShaderSources, kernel: string, variant?: QuantKind | KvType, reduce: ReduceKind = 'shared'): string {
  const parts: string[] = [];
  if (REDUCING_KERNELS.has(kernel)) parts.push(need(sources, `reduce/${reduce}`));
  else if (TREE_REDUCING_KERNELS.has(kernel)) parts.push(need(sources, 'reduce/shared'));
  if (BATCHED_MATMUL_KERNELS.has(kernel)) parts.push(need(sources, 'matmul/batched_io'));
  if (KV_KERNELS.has(kernel)) parts.push(need(sources, `kv/${variant ?? 'f32'}`));
  else if (variant) parts.push(need(sources, 'quant/bytes'), need(sources, `quant/${variant}`));
  parts.push(need(sources, kernel));
  const lines = parts.join('\n').split('\n');
  const enables = lines.filter((l) => /^\s*enable\s/.test(l));
  return [...new Set(enables), ...lines.filter((l) => !/^\s*enable\s/.test(l))].join('\n');
}

function need(sources: ShaderSources, name: string): string {
  const s = sources[name];
  if (s === undefined) throw new MeshError('SHADER_MISSING', `no WGSL source named ${name} (expected shaders/${name}.wgsl)`);
  return s;
}

/** Turns a map of "…/shaders/x/y.wgsl" paths to sources into ShaderSources keyed "x/y". */
export function sourcesFromPaths(byPath: Record<string, string>): ShaderSources {
  const out: Record<string, string> = {};
  for (const [path, src] of Object.entries(byPath)) {
    const m = /shaders\/(.+)\.wgsl$/.exec(path);
    if (m) out[m[1]!] = src;
  }
  return out;
}
