// Header-only GGUF specs that mimic the tensor layouts of DeepSeek-V4-Flash (`deepseek4`),
// GLM-5.2 (`glm-dsa`) and Qwen3.5-35B-A3B / Ornith-35B (`qwen35moe`) at full size: names and
// shapes as llama.cpp's loaders declare them (src/models/deepseek4.cpp, glm-dsa.cpp,
// qwen35moe.cpp), metadata keys as the bundled libllama names them. No tensor data is written,
// so a 284 B-parameter model is a ~100 KB file. Used by test/audit*.test.ts.

import { GgmlType } from '../src/gguf/types.ts';
import type { GgufSpec, MetadataEntry, TensorSpec } from '../src/gguf/writer.ts';

/** weight type for big matrices; vectors, routers and mixers stay F32 as in real files */
export interface FixtureTypes {
  matrix: GgmlType;
  experts: GgmlType;
}

const u32 = (key: string, value: number): MetadataEntry => ({ key, type: 'uint32', value });
const f32 = (key: string, value: number): MetadataEntry => ({ key, type: 'float32', value });
const str = (key: string, value: string): MetadataEntry => ({ key, type: 'string', value });
const u32s = (key: string, value: number[]): MetadataEntry => ({ key, type: 'array', itemType: 'uint32', value });
const bools = (key: string, value: boolean[]): MetadataEntry => ({ key, type: 'array', itemType: 'bool', value });

function tensor(name: string, type: GgmlType, ...shape: number[]): TensorSpec {
  return { name, type, shape };
}

// ---- DeepSeek-V4-Flash -------------------------------------------------------------------

export const DS4 = {
  nLayer: 43, nEmbd: 4096, nVocab: 129280, nHead: 64, headDim: 512, qLora: 1024, oGroups: 8, oLora: 1024,
  hc: 4, nExpert: 256, nUsed: 6, nFf: 2048, idxHeads: 64, idxDim: 128, hashLayers: 3, window: 128,
  /** the Flash checkpoint's schedule: 2 window layers, then CSA (4) / HCA (128) alternating */
  ratios: [0, 0, ...Array.from({ length: 20 }, () => [4, 128]).flat(), 4],
};

export function deepseek4Spec(types: FixtureTypes): GgufSpec {
  const d = DS4;
  const E = d.nEmbd;
  const mix = (2 + d.hc) * d.hc;
  const F = GgmlType.F32;
  const W = types.matrix;
  const X = types.experts;
  const t: TensorSpec[] = [tensor('token_embd.weight', W, E, d.nVocab)];
  for (let i = 0; i < d.nLayer; i++) {
    const p = `blk.${i}.`;
    t.push(
      tensor(p + 'attn_norm.weight', F, E),
      tensor(p + 'attn_sinks.weight', F, d.nHead),
      tensor(p + 'attn_q_a.weight', W, E, d.qLora),
      tensor(p + 'attn_q_a_norm.weight', F, d.qLora),
      tensor(p + 'attn_q_b.weight', W, d.qLora, d.nHead * d.headDim),
      tensor(p + 'attn_kv.weight', W, E, d.headDim),
      tensor(p + 'attn_kv_a_norm.weight', F, d.headDim),
      tensor(p + 'attn_output_a.weight', W, (d.nHead * d.headDim) / d.oGroups, d.oLora * d.oGroups),
      tensor(p + 'attn_output_b.weight', W, d.oGroups * d.oLora, E),
      tensor(p + 'hc_attn_fn.weight', F, d.hc * E, mix),
      tensor(p + 'hc_attn_base.weight', F, mix),
      tensor(p + 'hc_attn_scale.weight', F, 3),
      tensor(p + 'hc_ffn_fn.weight', F, d.hc * E, mix),
      tensor(p + 'hc_ffn_base.weight', F, mix),
      tensor(p + 'hc_ffn_scale.weight', F, 3),
    );
    const r = d.ratios[i]!;
    if (r !== 0) {
      const coff = r === 4 ? 2 : 1;
      t.push(
        tensor(p + 'attn_compressor_kv.weight', W, E, coff * d.headDim),
        tensor(p + 'attn_compressor_gate.weight', W, E, coff * d.headDim),
        tensor(p + 'attn_compressor_ape.weight', F, coff * d.headDim, r),
        tensor(p + 'attn_compressor_norm.weight', F, d.headDim),
      );
      if (r === 4) {
        t.push(
          tensor(p + 'indexer.proj.weight', F, E, d.idxHeads),
          tensor(p + 'indexer.attn_q_b.weight', W, d.qLora, d.idxHeads * d.idxDim),
          tensor(p + 'indexer_compressor_kv.weight', W, E, 2 * d.idxDim),
          tensor(p + 'indexer_compressor_gate.weight', W, E, 2 * d.idxDim),
          tensor(p + 'indexer_compressor_ape.weight', F, 2 * d.idxDim, r),
          tensor(p + 'indexer_compressor_norm.weight', F, d.idxDim),
        );
      }
    }
    t.push(tensor(p + 'ffn_gate_inp.weight', F, E, d.nExpert));
    if (i < d.hashLayers) t.push(tensor(p + 'ffn_gate_tid2eid.weight', GgmlType.I32, d.nUsed, d.nVocab));
    else t.push(tensor(p + 'exp_probs_b.bias', F, d.nExpert));
    t.push(
      tensor(p + 'ffn_norm.weight', F, E),
      tensor(p + 'ffn_gate_exps.weight', X, E, d.nFf, d.nExpert),
      tensor(p + 'ffn_down_exps.weight', X, d.nFf, E, d.nExpert),
      tensor(p + 'ffn_up_exps.weight', X, E, d.nFf, d.nExpert),
      tensor(p + 'ffn_gate_shexp.weight', W, E, d.nFf),
      tensor(p + 'ffn_down_shexp.weight', W, d.nFf, E),
      tensor(p + 'ffn_up_shexp.weight', W, E, d.nFf),
    );
  }
  t.push(
    tensor('output_hc_fn.weight', F, d.hc * E, d.hc),
    tensor('output_hc_base.weight', F, d.hc),
    tensor('output_hc_scale.weight', F, 1),
    tensor('output_norm.weight', F, E),
    tensor('output.weight', W, E, d.nVocab),
  );
  const a = 'deepseek4.';
  return {
    headerOnly: true,
    metadata: [
      str('general.architecture', 'deepseek4'),
      str('general.name', 'DeepSeek-V4-Flash layout (header only)'),
      u32(a + 'block_count', d.nLayer),
      u32(a + 'context_length', 1_048_576),
      u32(a + 'embedding_length', E),
      u32(a + 'vocab_size', d.nVocab),
      u32(a + 'attention.head_count', d.nHead),
      u32(a + 'attention.head_count_kv', 1),
      u32(a + 'attention.key_length', d.headDim),
      u32(a + 'attention.value_length', d.headDim),
      u32(a + 'rope.dimension_count', 64),
      f32(a + 'rope.freq_base', 10000),
      f32(a + 'attention.compress_rope_freq_base', 160000),
      u32(a + 'attention.q_lora_rank', d.qLora),
      u32(a + 'attention.output_lora_rank', d.oLora),
      u32(a + 'attention.output_group_count', d.oGroups),
      u32(a + 'attention.sliding_window', d.window),
      u32s(a + 'attention.compress_ratios', d.ratios),
      u32(a + 'attention.indexer.head_count', d.idxHeads),
      u32(a + 'attention.indexer.key_length', d.idxDim),
      u32(a + 'attention.indexer.top_k', 512),
      u32(a + 'expert_count', d.nExpert),
      u32(a + 'expert_used_count', d.nUsed),
      u32(a + 'expert_shared_count', 1),
      u32(a + 'expert_feed_forward_length', d.nFf),
      u32(a + 'hash_layer_count', d.hashLayers),
      u32(a + 'hyper_connection.count', d.hc),
      u32(a + 'hyper_connection.sinkhorn_iterations', 20),
      f32(a + 'hyper_connection.epsilon', 1e-6),
      f32(a + 'attention.layer_norm_rms_epsilon', 1e-6),
    ],
    tensors: t,
  };
}

// ---- GLM-5.2 -----------------------------------------------------------------------------

export const GLM = {
  nLayer: 78, nEmbd: 6144, nVocab: 154880, nHead: 64, qLora: 2048, kvLora: 512, nope: 192, rope: 64, vHead: 256,
  nFf: 12288, nFfExp: 2048, nExpert: 256, idxHeads: 32, idxDim: 128, dense: 3,
};

/** GLM-5.2's full-indexer layers: 0, 1, then every 4th from 2 (llama.cpp GLM_5_2_DEFAULT_INDEXER_TYPES) */
export function glm52Full(i: number): boolean {
  return i < 2 || (i - 2) % 4 === 0;
}

/**
 * `indexerTypes`: 'key' writes glm-dsa.attention.indexer.types (GLM-5.2 schedule), 'default'
 * leaves it out (llama.cpp then applies the 5.2 schedule to a 1M-context file), 'all-full'
 * writes a 5.1-style file (202,752 context, indexer on every layer, no key).
 */
export function glmDsaSpec(types: FixtureTypes, indexerTypes: 'key' | 'default' | 'all-full' = 'key'): GgufSpec {
  const g = GLM;
  const E = g.nEmbd;
  const F = GgmlType.F32;
  const W = types.matrix;
  const X = types.experts;
  const full = (i: number) => indexerTypes === 'all-full' || glm52Full(i);
  const t: TensorSpec[] = [tensor('token_embd.weight', W, E, g.nVocab)];
  const nBlocks = g.nLayer + 1; // + one MTP block
  for (let i = 0; i < nBlocks; i++) {
    const p = `blk.${i}.`;
    t.push(
      tensor(p + 'attn_norm.weight', F, E),
      tensor(p + 'attn_q_a_norm.weight', F, g.qLora),
      tensor(p + 'attn_kv_a_norm.weight', F, g.kvLora),
      tensor(p + 'attn_q_a.weight', W, E, g.qLora),
      tensor(p + 'attn_q_b.weight', W, g.qLora, g.nHead * (g.nope + g.rope)),
      tensor(p + 'attn_kv_a_mqa.weight', W, E, g.kvLora + g.rope),
      // rows of 192 are not whole 256-blocks: real files keep k_b in Q8_0
      tensor(p + 'attn_k_b.weight', GgmlType.Q8_0, g.nope, g.kvLora, g.nHead),
      tensor(p + 'attn_v_b.weight', W, g.kvLora, g.vHead, g.nHead),
      tensor(p + 'attn_output.weight', W, g.nHead * g.vHead, E),
      tensor(p + 'ffn_norm.weight', F, E),
    );
    if (i < g.nLayer && full(i)) {
      t.push(
        tensor(p + 'indexer.k_norm.weight', F, g.idxDim),
        tensor(p + 'indexer.k_norm.bias', F, g.idxDim),
        tensor(p + 'indexer.proj.weight', F, E, g.idxHeads),
        tensor(p + 'indexer.attn_k.weight', W, E, g.idxDim),
        tensor(p + 'indexer.attn_q_b.weight', W, g.qLora, g.idxHeads * g.idxDim),
      );
    }
    if (i < g.dense) {
      t.push(
        tensor(p + 'ffn_gate.weight', W, E, g.nFf),
        tensor(p + 'ffn_down.weight', W, g.nFf, E),
        tensor(p + 'ffn_up.weight', W, E, g.nFf),
      );
    } else {
      t.push(
        tensor(p + 'ffn_gate_inp.weight', F, E, g.nExpert),
        tensor(p + 'exp_probs_b.bias', F, g.nExpert),
        tensor(p + 'ffn_gate_exps.weight', X, E, g.nFfExp, g.nExpert),
        tensor(p + 'ffn_down_exps.weight', X, g.nFfExp, E, g.nExpert),
        tensor(p + 'ffn_up_exps.weight', X, E, g.nFfExp, g.nExpert),
        tensor(p + 'ffn_gate_shexp.weight', W, E, g.nFfExp),
        tensor(p + 'ffn_down_shexp.weight', W, g.nFfExp, E),
        tensor(p + 'ffn_up_shexp.weight', W, E, g.nFfExp),
      );
    }
    if (i >= g.nLayer) {
      t.push(
        tensor(p + 'nextn.eh_proj.weight', W, 2 * E, E),
        tensor(p + 'nextn.enorm.weight', F, E),
        tensor(p + 'nextn.hnorm.weight', F, E),
        tensor(p + 'nextn.shared_head_norm.weight', F, E),
      );
    }
  }
  t.push(tensor('output_norm.weight', F, E), tensor('output.weight', W, E, g.nVocab));
  const a = 'glm-dsa.';
  const metadata: MetadataEntry[] = [
    str('general.architecture', 'glm-dsa'),
    str('general.name', 'GLM-5.2 layout (header only)'),
    u32(a + 'block_count', nBlocks),
    u32(a + 'nextn_predict_layers', 1),
    u32(a + 'context_length', indexerTypes === 'all-full' ? 202_752 : 1_048_576),
    u32(a + 'embedding_length', E),
    u32(a + 'feed_forward_length', g.nFf),
    u32(a + 'attention.head_count', g.nHead),
    u32(a + 'attention.head_count_kv', 1),
    u32(a + 'attention.key_length', g.kvLora + g.rope),
    u32(a + 'attention.value_length', g.kvLora),
    u32(a + 'attention.key_length_mla', g.nope + g.rope),
    u32(a + 'attention.value_length_mla', g.vHead),
    u32(a + 'attention.q_lora_rank', g.qLora),
    u32(a + 'attention.kv_lora_rank', g.kvLora),
    u32(a + 'rope.dimension_count', g.rope),
    f32(a + 'rope.freq_base', 8e6),
    u32(a + 'leading_dense_block_count', g.dense),
    u32(a + 'expert_count', g.nExpert),
    u32(a + 'expert_used_count', 8),
    u32(a + 'expert_shared_count', 1),
    u32(a + 'expert_feed_forward_length', g.nFfExp),
    f32(a + 'expert_weights_scale', 2.5),
    u32(a + 'attention.indexer.head_count', g.idxHeads),
    u32(a + 'attention.indexer.key_length', g.idxDim),
    u32(a + 'attention.indexer.top_k', 2048),
  ];
  if (indexerTypes === 'key') {
    metadata.push(bools(a + 'attention.indexer.types', Array.from({ length: g.nLayer }, (_, i) => glm52Full(i))));
  }
  return { headerOnly: true, metadata, tensors: t };
}

// ---- Qwen3.5-35B-A3B / Ornith-35B ---------------------------------------------------------

export const QWEN35 = {
  nLayer: 40, nEmbd: 2048, nVocab: 248320, nHead: 16, nHeadKv: 2, headDim: 256, nExpert: 256, nFfExp: 512,
  nFfShexp: 512, kHeads: 16, vHeads: 32, ssmDim: 128, conv: 4,
};

export function qwen35moeSpec(types: FixtureTypes): GgufSpec {
  const q = QWEN35;
  const E = q.nEmbd;
  const F = GgmlType.F32;
  const W = types.matrix;
  const X = types.experts;
  const keyDim = q.kHeads * q.ssmDim;
  const valueDim = q.vHeads * q.ssmDim;
  const t: TensorSpec[] = [tensor('token_embd.weight', W, E, q.nVocab)];
  for (let i = 0; i < q.nLayer; i++) {
    const p = `blk.${i}.`;
    t.push(tensor(p + 'attn_norm.weight', F, E), tensor(p + 'post_attention_norm.weight', F, E));
    if ((i + 1) % 4 === 0) {
      t.push(
        tensor(p + 'attn_q.weight', W, E, q.headDim * q.nHead * 2),
        tensor(p + 'attn_k.weight', W, E, q.headDim * q.nHeadKv),
        tensor(p + 'attn_v.weight', W, E, q.headDim * q.nHeadKv),
        tensor(p + 'attn_output.weight', W, q.headDim * q.nHead, E),
        tensor(p + 'attn_q_norm.weight', F, q.headDim),
        tensor(p + 'attn_k_norm.weight', F, q.headDim),
      );
    } else {
      t.push(
        tensor(p + 'attn_qkv.weight', W, E, 2 * keyDim + valueDim),
        tensor(p + 'attn_gate.weight', W, E, valueDim),
        tensor(p + 'ssm_conv1d.weight', F, q.conv, 2 * keyDim + valueDim),
        tensor(p + 'ssm_dt.bias', F, q.vHeads),
        tensor(p + 'ssm_a', F, q.vHeads),
        tensor(p + 'ssm_beta.weight', F, E, q.vHeads),
        tensor(p + 'ssm_alpha.weight', F, E, q.vHeads),
        tensor(p + 'ssm_norm.weight', F, q.ssmDim),
        tensor(p + 'ssm_out.weight', W, valueDim, E),
      );
    }
    t.push(
      tensor(p + 'ffn_gate_inp.weight', F, E, q.nExpert),
      tensor(p + 'ffn_down_exps.weight', X, q.nFfExp, E, q.nExpert),
      tensor(p + 'ffn_gate_exps.weight', X, E, q.nFfExp, q.nExpert),
      tensor(p + 'ffn_up_exps.weight', X, E, q.nFfExp, q.nExpert),
      tensor(p + 'ffn_gate_inp_shexp.weight', F, E),
      tensor(p + 'ffn_gate_shexp.weight', W, E, q.nFfShexp),
      tensor(p + 'ffn_up_shexp.weight', W, E, q.nFfShexp),
      tensor(p + 'ffn_down_shexp.weight', W, q.nFfShexp, E),
    );
  }
  t.push(tensor('output_norm.weight', F, E), tensor('output.weight', W, E, q.nVocab));
  const a = 'qwen35moe.';
  return {
    headerOnly: true,
    metadata: [
      str('general.architecture', 'qwen35moe'),
      str('general.name', 'Qwen3.5-35B-A3B / Ornith-35B layout (header only)'),
      u32(a + 'block_count', q.nLayer),
      u32(a + 'context_length', 262_144),
      u32(a + 'embedding_length', E),
      u32(a + 'attention.head_count', q.nHead),
      u32(a + 'attention.head_count_kv', q.nHeadKv),
      u32(a + 'attention.key_length', q.headDim),
      u32(a + 'attention.value_length', q.headDim),
      u32(a + 'rope.dimension_count', 64),
      u32s(a + 'rope.dimension_sections', [11, 11, 10, 0]),
      f32(a + 'rope.freq_base', 1e7),
      u32(a + 'expert_count', q.nExpert),
      u32(a + 'expert_used_count', 8),
      u32(a + 'expert_feed_forward_length', q.nFfExp),
      u32(a + 'expert_shared_feed_forward_length', q.nFfShexp),
      u32(a + 'ssm.conv_kernel', q.conv),
      u32(a + 'ssm.inner_size', valueDim),
      u32(a + 'ssm.state_size', q.ssmDim),
      u32(a + 'ssm.time_step_rank', q.vHeads),
      u32(a + 'ssm.group_count', q.kHeads),
      u32(a + 'full_attention_interval', 4),
    ],
    tensors: t,
  };
}
