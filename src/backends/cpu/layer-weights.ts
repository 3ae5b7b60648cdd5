// The weights of one transformer block as the CPU engine computes with them, gathered from the
// artifact's tensors for every architecture we run: separate or fused (phi3) q/k/v, biases
// (qwen2), per-head q/k norms (qwen3, gemma3), post-norms (gemma3), and a dense feed-forward
// (its gate and up fused in one tensor for phi3) or a mixture of experts whose 3-D
// ffn_*_exps tensors become one matrix per expert.

import { MeshError } from '../../errors.ts';
import type { ModelConfig } from '../../model/config.ts';
import type { DenseFfn, MoeFfn } from './ffn.ts';
import type { Matrix } from './matrix.ts';

export interface LayerWeights {
  attnNorm: Float32Array; // [nEmbd]
  wq: Matrix; // [nHead·headDim × nEmbd]
  wk: Matrix; // [nHeadKv·headDim × nEmbd]
  wv: Matrix; // [nHeadKv·headDim × nEmbd]
  wo: Matrix; // [nEmbd × nHead·headDim]
  bq: Float32Array | null; // [nHead·headDim] (qwen2)
  bk: Float32Array | null; // [nHeadKv·headDim]
  bv: Float32Array | null; // [nHeadKv·headDim]
  qNorm: Float32Array | null; // [headDim] (qwen3, gemma3)
  kNorm: Float32Array | null; // [headDim]
  attnPostNorm: Float32Array | null; // [nEmbd] (gemma3)
  ffnNorm: Float32Array; // [nEmbd]
  ffnPostNorm: Float32Array | null; // [nEmbd] (gemma3)
  ffn: DenseFfn | MoeFfn;
}

/** How a layer's tensors are read: by name, with shapes checked (BAD_TENSOR_SHAPE). */
export interface TensorLoader {
  has(name: string): boolean;
  /** a 1-D tensor of `length` f32 values */
  vector(name: string, length: number): Float32Array;
  /** a whole 2-D tensor [cols, rows] (ggml order) */
  matrix(name: string, cols: number, rows: number): Matrix;
  /** rows [row0, row0 + rows) of a tensor whose rows hold `cols` values (fused tensors, experts) */
  rows(name: string, cols: number, row0: number, rows: number, label: string): Matrix;
  /** the ne2 × ne1 rows of a tensor [cols, rows, nExpert] as one matrix per expert */
  experts(name: string, cols: number, rows: number, nExpert: number): Matrix[];
}

/** Layer `il`'s feed-forward: dense, or a mixture of experts (with its shared expert). */
export function loadFfn(t: TensorLoader, config: ModelConfig, il: number): DenseFfn | MoeFfn {
  return config.moe ? moeWeights(t, config, `blk.${il}.`) : denseWeights(t, config.nEmbd, config.nFf, `blk.${il}.`, '');
}

/** Layer `il`'s weights (global index) for `config` (Qwen3.5 blocks: ./hybrid-layer.ts). */
export function loadLayer(t: TensorLoader, config: ModelConfig, il: number): LayerWeights {
  const { nEmbd, headDim } = config;
  const qDim = config.nHead * headDim;
  const kvDim = config.nHeadKv * headDim;
  const p = `blk.${il}.`;
  const optionalVector = (name: string, length: number) => (t.has(name) ? t.vector(name, length) : null);
  const bias = (name: string, length: number) => (config.qkvBias ? t.vector(name, length) : optionalVector(name, length));
  let wq: Matrix, wk: Matrix, wv: Matrix;
  let fusedBias: Float32Array | null = null;
  if (t.has(`${p}attn_qkv.weight`)) {
    // phi3: one [nEmbd, qDim + 2·kvDim] projection, rows q | k | v (and its bias, if any)
    const name = `${p}attn_qkv.weight`;
    wq = t.rows(name, nEmbd, 0, qDim, `${name}[q]`);
    wk = t.rows(name, nEmbd, qDim, kvDim, `${name}[k]`);
    wv = t.rows(name, nEmbd, qDim + kvDim, kvDim, `${name}[v]`);
    fusedBias = optionalVector(`${p}attn_qkv.bias`, qDim + 2 * kvDim);
  } else {
    wq = t.matrix(`${p}attn_q.weight`, nEmbd, qDim);
    wk = t.matrix(`${p}attn_k.weight`, nEmbd, kvDim);
    wv = t.matrix(`${p}attn_v.weight`, nEmbd, kvDim);
  }
  return {
    attnNorm: t.vector(`${p}attn_norm.weight`, nEmbd),
    wq,
    wk,
    wv,
    wo: t.matrix(`${p}attn_output.weight`, qDim, nEmbd),
    bq: fusedBias ? fusedBias.subarray(0, qDim) : bias(`${p}attn_q.bias`, qDim),
    bk: fusedBias ? fusedBias.subarray(qDim, qDim + kvDim) : bias(`${p}attn_k.bias`, kvDim),
    bv: fusedBias ? fusedBias.subarray(qDim + kvDim) : bias(`${p}attn_v.bias`, kvDim),
    qNorm: config.qkNorm ? t.vector(`${p}attn_q_norm.weight`, headDim) : null,
    kNorm: config.qkNorm ? t.vector(`${p}attn_k_norm.weight`, headDim) : null,
    attnPostNorm: config.postNorms ? t.vector(`${p}post_attention_norm.weight`, nEmbd) : null,
    ffnNorm: t.vector(`${p}ffn_norm.weight`, nEmbd),
    ffnPostNorm: config.postNorms ? t.vector(`${p}post_ffw_norm.weight`, nEmbd) : null,
    ffn: loadFfn(t, config, il),
  };
}

/** ffn_{gate,up,down}{suffix}; phi3 fuses gate and up into ffn_up [nEmbd, 2·nFf] (gate rows first). */
function denseWeights(t: TensorLoader, nEmbd: number, nFf: number, p: string, suffix: string): DenseFfn {
  const up = `${p}ffn_up${suffix}.weight`;
  const fused = !t.has(`${p}ffn_gate${suffix}.weight`);
  return {
    kind: 'dense',
    wGate: fused ? t.rows(up, nEmbd, 0, nFf, `${up}[gate]`) : t.matrix(`${p}ffn_gate${suffix}.weight`, nEmbd, nFf),
    wUp: fused ? t.rows(up, nEmbd, nFf, nFf, `${up}[up]`) : t.matrix(up, nEmbd, nFf),
    wDown: t.matrix(`${p}ffn_down${suffix}.weight`, nFf, nEmbd),
  };
}

function moeWeights(t: TensorLoader, config: ModelConfig, p: string): MoeFfn {
  const moe = config.moe!;
  const { nEmbd } = config;
  if (t.has(`${p}ffn_gate_up_exps.weight`)) {
    throw new MeshError('UNSUPPORTED_TENSOR_LAYOUT', `${p}ffn_gate_up_exps.weight (fused expert gate/up) is not supported`);
  }
  return {
    kind: 'moe',
    router: t.matrix(`${p}ffn_gate_inp.weight`, nEmbd, moe.nExpert),
    gate: t.experts(`${p}ffn_gate_exps.weight`, nEmbd, moe.nFfExp, moe.nExpert),
    up: t.experts(`${p}ffn_up_exps.weight`, nEmbd, moe.nFfExp, moe.nExpert),
    down: t.experts(`${p}ffn_down_exps.weight`, moe.nFfExp, nEmbd, moe.nExpert),
    shared:
      moe.nFfShared > 0
        ? { gateInp: t.rows(`${p}ffn_gate_inp_shexp.weight`, nEmbd, 0, 1, `${p}ffn_gate_inp_shexp.weight`), ffn: denseWeights(t, nEmbd, moe.nFfShared, p, '_shexp') }
        : null,
  };
}
