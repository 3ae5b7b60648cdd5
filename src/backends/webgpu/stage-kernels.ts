// Which kernels a stage runs — chosen once from the adapter and the stage's options — and the
// set of pipelines a forward over one shard can use, so they all compile at load.

import { activationFormatFor } from '../cpu/act-round.ts';
import type { AdapterSummary } from './device.ts';
import * as op from './ops.ts';
import type { MatMulKernel, MatVecKernel } from './ops.ts';
import type { KvType, QuantKind } from './shader-library.ts';
import { shardExperts, shardMatrices } from './shard-weights.ts';
import type { ShardWeights } from './shard-weights.ts';

export interface WebGpuStageOptions {
  /** split weight matrices into buffers of at most this many bytes (default: the device limit) */
  maxChunkBytes?: number;
  /** split each layer's KV cache by heads into buffers of at most this many bytes (default: the device limit) */
  maxKvBindingBytes?: number;
  /** matrix × vector kernel for decode; 'auto' picks mul_mat on software adapters */
  matVec?: MatVecKernel | 'auto';
  /** matrix × matrix kernel for prefill; 'auto' picks mul_mat_tiled except on software adapters */
  matMul?: MatMulKernel | 'auto';
  /**
   * 'ggml' (default, like the CPU reference): round activations as llama.cpp's CPU backend does
   * before each quantised or f16 matmul, so greedy tokens match it; 'none': exact f32.
   */
  activationRounding?: 'ggml' | 'none';
  /** KV cache elements: 'f32' (default, like the CPU reference) or 'f16' (half the memory, like llama.cpp's default) */
  kvType?: KvType;
}

/** The stage's kernel choices, resolved. */
export interface StageKernels {
  matVec: MatVecKernel;
  matMul: MatMulKernel;
  /** whether matmul inputs are rounded the ggml way first */
  roundActivations: boolean;
  kvType: KvType;
  /** bytes per KV cache element */
  kvElementBytes: number;
}

/** Software adapters (slow barriers) get the barrier-free mul_mat; hardware the reduced and tiled kernels. */
export function chooseStageKernels(adapter: AdapterSummary, options: WebGpuStageOptions): StageKernels {
  const choice = options.matVec ?? 'auto';
  const batched = options.matMul ?? 'auto';
  const kvType = options.kvType ?? 'f32';
  return {
    matVec: choice === 'auto' ? (adapter.isFallbackAdapter ? 'mul_mat' : 'mul_mat_vec') : choice,
    matMul: batched === 'auto' ? (adapter.isFallbackAdapter ? 'mul_mat' : 'mul_mat_tiled') : batched,
    roundActivations: options.activationRounding !== 'none',
    kvType,
    kvElementBytes: kvType === 'f16' ? 2 : 4,
  };
}

export interface PipelineWanted {
  kernel: string;
  quant?: QuantKind;
  entry?: string;
}

/** Every pipeline a forward over this shard can use. */
export function pipelinesFor(m: ShardWeights, k: StageKernels): PipelineWanted[] {
  const out: PipelineWanted[] = [];
  const matrices = shardMatrices(m);
  for (const q of new Set(matrices.map((w) => w.quant))) {
    const ofType = matrices.filter((w) => w.quant === q);
    const kernels = new Set<string>([k.matVec]);
    // batches: the tiled kernel where the rows fit its k-steps, mul_mat otherwise
    if (k.matMul === 'mul_mat_tiled') kernels.add('mul_mat_tiled');
    if (k.matMul === 'mul_mat' || ofType.some((w) => !op.tiledFits(w.k))) kernels.add('mul_mat');
    for (const kernel of kernels) out.push({ kernel, quant: q });
  }
  // experts: the grouped matmul always (prefill, and decode on software adapters), the gather mat-vec for GPU decode
  const experts = shardExperts(m);
  for (const q of new Set(experts.map((e) => e.quant))) {
    out.push({ kernel: 'mul_mat_id', quant: q });
    if (k.matVec === 'mul_mat_vec') out.push({ kernel: 'mul_mat_vec_id', quant: q });
  }
  if (experts.length > 0) {
    const moe = m.config.moe!;
    out.push({ kernel: 'moe_route' }, { kernel: 'moe_group' }, { kernel: 'moe_combine', entry: moe.nFfShared > 0 ? (moe.sigmoidSharedGate ? 'with_sigmoid_shared' : 'with_shared') : 'main' });
  }
  if (m.tokenEmbd) out.push({ kernel: 'get_rows', quant: m.tokenEmbd.quant });
  if (k.roundActivations) {
    for (const f of new Set([...matrices, ...experts].map((w) => activationFormatFor(w.type)))) {
      if (f !== 'f32') out.push({ kernel: 'round_activations', entry: f === 'q8_K' ? 'q8_k' : f });
    }
  }
  const c = m.config;
  if (c.embedScale !== 1 || c.queryScale !== null) out.push({ kernel: 'scale' });
  out.push(
    { kernel: 'rms_norm' },
    { kernel: 'rope' },
    { kernel: 'add' },
    { kernel: c.ffnActivation === 'gelu' ? 'geglu' : 'swiglu' },
    { kernel: 'attention_decode', quant: k.kvType, entry: 'split' },
    { kernel: 'attention_decode', quant: k.kvType, entry: 'combine' },
    { kernel: 'attention_prefill', quant: k.kvType },
  );
  if (c.linearAttention) out.push({ kernel: 'delta_net_gates' }, { kernel: 'delta_net_step' }, { kernel: 'delta_net_fold' }, { kernel: 'swiglu' });
  if (c.attnOutputGate) out.push({ kernel: 'sigmoid_gate' });
  if (k.kvType === 'f16') out.push({ kernel: 'pack_f16' });
  out.push({ kernel: 'kv_store', entry: k.kvType === 'f16' ? 'store_f16' : 'store_f32' });
  return out;
}
