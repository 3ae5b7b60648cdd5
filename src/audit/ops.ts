// What each architecture needs, in named operations, and which of them each gguf-mesh
// backend implements. The tables follow llama.cpp's graphs (src/models/<arch>.cpp) and the
// audits in docs/audits/; they are data, so adding an architecture or an op is one line.

import type { GgmlType } from '../gguf/types.ts';
import { DEQUANT_TYPES } from '../gguf/dequant.ts';
import { SUPPORTED_ARCHITECTURES } from '../model/config.ts';
import { SUPPORTED_WEIGHT_TYPES } from '../backends/webgpu/shader-library.ts';
import { LLAMACPP_WHOLE_MODEL_ARCHITECTURES } from '../backends/llamacpp/architectures.ts';

export const OPS = {
  embed_lookup: 'token embedding row lookup',
  rms_norm: 'RMSNorm with weight',
  rope_normal: 'RoPE, adjacent-pair rotation',
  rope_neox: 'RoPE, half-split (NeoX) rotation',
  gqa_attention: 'grouped-query causal attention over a KV cache',
  swiglu: 'SwiGLU feed-forward (gate, up, down)',
  output_head: 'output norm + vocabulary projection',
  attn_bias: 'bias on the q/k/v projections',
  qk_norm: 'per-head RMSNorm of queries and keys',
  partial_rope: 'RoPE on a slice of each head',
  yarn_rope: 'YaRN-scaled RoPE with attention-magnitude correction',
  mrope: 'multi-section RoPE layout (rope.dimension_sections)',
  moe_router_softmax: 'MoE router: softmax scores, top-k, renormalise',
  moe_router_sigmoid_bias: 'MoE router: sigmoid scores + selection bias, top-k, renormalise, scale',
  moe_router_sqrtsoftplus_bias: 'MoE router: sqrt(softplus) scores + selection bias, top-k, renormalise, scale',
  moe_expert_matmul: 'expert-indexed matmul over 3-D expert tensors',
  moe_shared_expert: 'always-on shared expert added to the routed output',
  moe_shared_expert_gate: 'sigmoid gate on the shared expert (ffn_gate_inp_shexp)',
  moe_hash_routing: 'experts chosen by token id (ffn_gate_tid2eid, I32 table)',
  swiglu_clamp: 'SwiGLU with clamped gate/up pre-activations',
  mla_attention: 'multi-head latent attention (low-rank q, kv latent, absorbed k_b/v_b)',
  layer_norm_bias: 'LayerNorm with weight and bias',
  hadamard_rotation: 'Hadamard rotation of indexer queries/keys',
  dsa_indexer: 'lightning indexer: ReLU(q·k)·w over indexer heads, top-k tokens',
  top_k_sparse_mask: 'attention masked to the indexer top-k',
  index_share: 'shared-indexer layers reuse the previous full layer top-k',
  mhc_mixer: 'hyper-connection pre/post mixers over 4 residual streams',
  sinkhorn: 'Sinkhorn-Knopp normalisation of the 4×4 stream-mixing matrix',
  mhc_head: 'hyper-connection collapse of the streams before the output norm',
  mqa_shared_kv: 'single shared K=V head (MQA, head dim 512)',
  attention_sinks: 'per-head attention-sink logit in the softmax',
  inverse_rope: 'inverse RoPE on the attention output',
  sliding_window: 'sliding-window raw KV ring',
  kv_compressor: 'gated-softmax KV compression (ratio 4 / 128) with position table',
  grouped_output_lora: 'grouped low-rank output projection',
  gated_deltanet: 'Gated DeltaNet linear-attention recurrence',
  conv1d_state: 'causal depthwise conv1d with carried state',
  l2_norm: 'L2 normalisation of q/k',
  gated_rms_norm: 'RMSNorm gated by SiLU(z)',
  recurrent_state: 'per-session recurrent state (besides the KV cache)',
  attn_output_gate: 'sigmoid output gate from the q projection',
  geglu: 'GeGLU feed-forward (tanh-GELU gate, as ggml with its f16 table)',
  post_norms: 'RMSNorm of the attention and feed-forward outputs before the residual adds',
  embed_scale: 'token embeddings scaled by √n_embd',
  query_scale: 'queries scaled before attention (scores not scaled again)',
  swa_mask: 'sliding-window attention mask on interleaved layers, with their own rope base',
  fused_qkv: 'one fused q/k/v projection (attn_qkv)',
  fused_gate_up: 'gate and up in one tensor (ffn_up of 2·n_ff rows)',
  longrope_factors: 'LongRoPE short/long frequency factors chosen by context length',
  logit_softcap: 'final logits soft-capped by c·tanh(x / c)',
} as const;

export type OpId = keyof typeof OPS;

const DENSE_LLAMA: OpId[] = ['embed_lookup', 'rms_norm', 'rope_normal', 'gqa_attention', 'swiglu', 'output_head'];
const MOE_SOFTMAX: OpId[] = ['moe_router_softmax', 'moe_expert_matmul'];
const MLA_MOE: OpId[] = [
  'embed_lookup', 'rms_norm', 'mla_attention', 'rope_normal', 'yarn_rope', 'swiglu',
  'moe_router_sigmoid_bias', 'moe_expert_matmul', 'moe_shared_expert', 'output_head',
];
const DSA: OpId[] = ['dsa_indexer', 'layer_norm_bias', 'hadamard_rotation', 'top_k_sparse_mask'];
const QWEN35: OpId[] = [
  'embed_lookup', 'rms_norm', 'gqa_attention', 'qk_norm', 'partial_rope', 'mrope', 'attn_output_gate',
  'gated_deltanet', 'conv1d_state', 'l2_norm', 'gated_rms_norm', 'recurrent_state', 'output_head',
];

/** Operations each architecture's forward pass uses (llama.cpp graph names in parentheses). */
export const ARCH_OPS: Readonly<Record<string, readonly OpId[]>> = {
  llama: DENSE_LLAMA,
  qwen2: [...DENSE_LLAMA, 'rope_neox', 'attn_bias'],
  qwen3: [...DENSE_LLAMA, 'rope_neox', 'qk_norm'],
  qwen3moe: [...DENSE_LLAMA, 'rope_neox', 'qk_norm', ...MOE_SOFTMAX],
  qwen2moe: [...DENSE_LLAMA, 'rope_neox', 'attn_bias', ...MOE_SOFTMAX, 'moe_shared_expert', 'moe_shared_expert_gate'],
  gemma3: [
    'embed_lookup', 'embed_scale', 'rms_norm', 'rope_neox', 'gqa_attention', 'qk_norm', 'query_scale', 'swa_mask',
    'post_norms', 'geglu', 'output_head', 'logit_softcap',
  ],
  phi3: [...DENSE_LLAMA.filter((op) => op !== 'rope_normal'), 'rope_neox', 'fused_qkv', 'fused_gate_up', 'query_scale', 'longrope_factors'],
  qwen35: [...QWEN35, 'swiglu'],
  qwen35moe: [...QWEN35, ...MOE_SOFTMAX, 'swiglu', 'moe_shared_expert', 'moe_shared_expert_gate'],
  deepseek2: MLA_MOE,
  deepseek32: [...MLA_MOE, ...DSA],
  // GLM-5.x reaches 1M tokens with a larger RoPE base, not YaRN
  'glm-dsa': [...MLA_MOE.filter((op) => op !== 'yarn_rope'), ...DSA, 'index_share'],
  glm4moe: [...DENSE_LLAMA, 'rope_neox', 'partial_rope', 'qk_norm', 'attn_bias', 'moe_router_sigmoid_bias', 'moe_expert_matmul', 'moe_shared_expert'],
  deepseek4: [
    'embed_lookup', 'rms_norm', 'mhc_mixer', 'sinkhorn', 'mhc_head', 'mqa_shared_kv', 'attention_sinks',
    'rope_normal', 'partial_rope', 'yarn_rope', 'inverse_rope', 'sliding_window', 'kv_compressor',
    ...DSA, 'grouped_output_lora', 'moe_router_sqrtsoftplus_bias', 'moe_expert_matmul',
    'moe_shared_expert', 'moe_hash_routing', 'swiglu', 'swiglu_clamp', 'output_head',
  ],
};

export type BackendId = 'cpu' | 'webgpu' | 'llamacpp';

/** Ops the CPU reference and the WGSL backend implement today (the architectures of SUPPORTED_ARCHITECTURES). */
const ENGINE_OPS: ReadonlySet<OpId> = new Set<OpId>([
  ...DENSE_LLAMA, 'rope_neox', 'attn_bias', 'qk_norm', 'yarn_rope', ...MOE_SOFTMAX, 'moe_shared_expert', 'moe_shared_expert_gate',
  'geglu', 'post_norms', 'embed_scale', 'query_scale', 'swa_mask', 'fused_qkv', 'fused_gate_up', 'longrope_factors', 'logit_softcap',
]);
export const BACKEND_OPS: Readonly<Record<'cpu' | 'webgpu', ReadonlySet<OpId>>> = {
  // both also run Qwen3.5's hybrid blocks (text positions: its M-RoPE is a partial NeoX rope)
  cpu: new Set<OpId>([...ENGINE_OPS, ...QWEN35]),
  webgpu: new Set<OpId>([...ENGINE_OPS, ...QWEN35]),
};

/**
 * Architectures each backend runs. The CPU and WebGPU backends both read their model through
 * the model config's configFromHeader, so both lists are its own.
 */
export const BACKEND_ARCHS: Readonly<Record<BackendId, ReadonlySet<string>>> = {
  cpu: new Set(SUPPORTED_ARCHITECTURES),
  webgpu: new Set(SUPPORTED_ARCHITECTURES),
  // every architecture the bundled llama.cpp generates with (src/backends/llamacpp/architectures.ts)
  llamacpp: new Set(LLAMACPP_WHOLE_MODEL_ARCHITECTURES),
};

/** ggml types whose weights each backend reads. llama.cpp reads every type a GGUF may hold. */
export const BACKEND_TYPES: Readonly<Record<'cpu' | 'webgpu', ReadonlySet<GgmlType>>> = {
  cpu: new Set(DEQUANT_TYPES),
  // the types with a dequant snippet in shaders/quant/, as the shader library maps them
  webgpu: new Set(SUPPORTED_WEIGHT_TYPES),
};

/** The ops `arch` needs that `backend` lacks; undefined when no table knows the architecture. */
export function missingOps(arch: string, backend: 'cpu' | 'webgpu'): OpId[] | undefined {
  const needed = ARCH_OPS[arch];
  if (!needed) return undefined;
  const have = BACKEND_OPS[backend];
  return [...new Set(needed)].filter((op) => !have.has(op));
}
