// Synthetic qwen35 / qwen35moe blocks with llama.cpp's tensor names and shapes
// (src/models/qwen35moe.cpp `load_arch_tensors`) and the metadata its `load_arch_hparams`
// reads: Gated DeltaNet blocks (attn_qkv, attn_gate, ssm_*) and, every `fullAttnInterval`-th
// block, gated full attention (attn_q twice as wide: query and gate per head), both with
// attn_norm before and post_attention_norm before the feed-forward (dense, or experts plus a
// sigmoid-gated shared expert).

import type { MetadataEntry } from '../gguf/writer.ts';
import type { Init, TensorList, TensorOptions } from './synthetic-tensors.ts';

export const HYBRID_ARCHS = ['qwen35', 'qwen35moe'] as const;

/** What the hybrid blocks add to the tensor options. */
export interface HybridTensorOptions extends TensorOptions {
  expertsUsed: number;
  /** Gated DeltaNet q/k heads (ssm.group_count) */
  linearKHeads: number;
  /** Gated DeltaNet v heads (ssm.time_step_rank) */
  linearVHeads: number;
  /** size of one DeltaNet head (ssm.state_size) */
  linearHeadDim: number;
  /** causal conv width (ssm.conv_kernel) */
  convKernel: number;
  /** every n-th block is full attention */
  fullAttnInterval: number;
  /** rotated dimensions per full-attention head (partial rotary) */
  ropeDims: number;
}

const NORM: Init = { mean: 1, std: 0.02 };
const proj = (nIn: number): number => 1 / Math.sqrt(nIn);

export function isHybridArch(arch: string): boolean {
  return (HYBRID_ARCHS as readonly string[]).includes(arch);
}

/** Block i of a qwen35 / qwen35moe model. */
export function hybridLayerTensors(list: TensorList, o: HybridTensorOptions, i: number): void {
  const p = `blk.${i}.`;
  const { embd } = o;
  list.vector(`${p}attn_norm.weight`, embd, NORM);
  if ((i + 1) % o.fullAttnInterval !== 0) {
    const keyDim = o.linearKHeads * o.linearHeadDim;
    const valueDim = o.linearVHeads * o.linearHeadDim;
    list.matrix(`${p}attn_qkv.weight`, 'attn_qkv', i, [embd, 2 * keyDim + valueDim], proj(embd));
    list.matrix(`${p}attn_gate.weight`, 'attn_q', i, [embd, valueDim], proj(embd));
    // the conv taps [conv_kernel, channels] and the per-head decay/step parameters stay F32
    list.matrix(`${p}ssm_conv1d.weight`, 'router', i, [o.convKernel, 2 * keyDim + valueDim], proj(o.convKernel));
    list.vector(`${p}ssm_dt.bias`, o.linearVHeads, { mean: 0, std: 0.5 });
    // ssm_a = −exp(A_log) < 0, so every step decays the state
    list.vector(`${p}ssm_a`, o.linearVHeads, { mean: -1.5, std: 0.3, abs: true });
    list.matrix(`${p}ssm_beta.weight`, 'router', i, [embd, o.linearVHeads], proj(embd));
    list.matrix(`${p}ssm_alpha.weight`, 'router', i, [embd, o.linearVHeads], proj(embd));
    list.vector(`${p}ssm_norm.weight`, o.linearHeadDim, NORM);
    list.matrix(`${p}ssm_out.weight`, 'attn_output', i, [valueDim, embd], proj(valueDim));
  } else {
    const qDim = o.heads * o.headDim;
    const kvDim = o.kvHeads * o.headDim;
    list.matrix(`${p}attn_q.weight`, 'attn_q', i, [embd, 2 * qDim], proj(embd));
    list.matrix(`${p}attn_k.weight`, 'attn_k', i, [embd, kvDim], proj(embd));
    list.matrix(`${p}attn_v.weight`, 'attn_v', i, [embd, kvDim], proj(embd));
    list.matrix(`${p}attn_output.weight`, 'attn_output', i, [qDim, embd], proj(qDim));
    list.vector(`${p}attn_q_norm.weight`, o.headDim, NORM);
    list.vector(`${p}attn_k_norm.weight`, o.headDim, NORM);
  }
  list.vector(`${p}post_attention_norm.weight`, embd, NORM);
  if (o.arch === 'qwen35moe') {
    const ff = o.expertFfn;
    list.matrix(`${p}ffn_gate_inp.weight`, 'router', i, [embd, o.experts], 4 * proj(embd));
    list.matrix(`${p}ffn_gate_exps.weight`, 'ffn_gate', i, [embd, ff, o.experts], proj(embd));
    list.matrix(`${p}ffn_up_exps.weight`, 'ffn_up', i, [embd, ff, o.experts], proj(embd));
    list.matrix(`${p}ffn_down_exps.weight`, 'ffn_down', i, [ff, embd, o.experts], proj(ff));
    list.vector(`${p}ffn_gate_inp_shexp.weight`, embd, { mean: 0, std: proj(embd) });
    list.matrix(`${p}ffn_gate_shexp.weight`, 'ffn_gate', i, [embd, o.sharedFfn], proj(embd));
    list.matrix(`${p}ffn_up_shexp.weight`, 'ffn_up', i, [embd, o.sharedFfn], proj(embd));
    list.matrix(`${p}ffn_down_shexp.weight`, 'ffn_down', i, [o.sharedFfn, embd], proj(o.sharedFfn));
  } else {
    list.matrix(`${p}ffn_gate.weight`, 'ffn_gate', i, [embd, o.ffn], proj(embd));
    list.matrix(`${p}ffn_up.weight`, 'ffn_up', i, [embd, o.ffn], proj(embd));
    list.matrix(`${p}ffn_down.weight`, 'ffn_down', i, [o.ffn, embd], proj(o.ffn));
  }
}

/**
 * Interleaved rope sections [t, h, w, 0] for `ropeDims` rotated dimensions that give every
 * rotated pair a text position (Qwen3.5's 64 dims: [11, 11, 10, 0]).
 */
export function textRopeSections(ropeDims: number): number[] {
  const pairs = ropeDims / 2;
  const t = Math.ceil(pairs / 3);
  return [t, t, pairs - 2 * t, 0];
}

/** The keys llama.cpp's qwen35 / qwen35moe loaders read beyond the common ones. */
export function hybridMetadata(o: HybridTensorOptions): MetadataEntry[] {
  const u32 = (key: string, value: number): MetadataEntry => ({ key: `${o.arch}.${key}`, type: 'uint32', value });
  const out: MetadataEntry[] = [
    u32('ssm.conv_kernel', o.convKernel),
    u32('ssm.state_size', o.linearHeadDim),
    u32('ssm.group_count', o.linearKHeads),
    u32('ssm.time_step_rank', o.linearVHeads),
    u32('ssm.inner_size', o.linearVHeads * o.linearHeadDim),
    u32('full_attention_interval', o.fullAttnInterval),
    { key: `${o.arch}.rope.dimension_sections`, type: 'array', itemType: 'int32', value: textRopeSections(o.ropeDims) },
  ];
  if (o.arch === 'qwen35moe') {
    out.push(u32('expert_count', o.experts), u32('expert_used_count', o.expertsUsed), u32('expert_feed_forward_length', o.expertFfn), u32('expert_shared_feed_forward_length', o.sharedFfn));
  }
  return out;
}
