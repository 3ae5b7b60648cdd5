// The weight types `npm run bench -- webgpu` times, and a MoE model's decode bytes per token on
// the WebGPU stage (its kernels' own accounting beside the audit's active bytes per token).

import { auditHeader } from '../../src/audit/report.ts';
import { createNodeWebGpuStage } from '../../src/backends/webgpu/node.ts';
import { QUANT_OF_TYPE } from '../../src/backends/webgpu/shader-library.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import { GgmlType } from '../../src/gguf/types.ts';
import { configFromHeader, loadRopeFreqFactors, ROPE_FACTOR_TENSORS } from '../../src/model/config.ts';
import { argmax } from '../../src/model/sampler.ts';
import type { MakeModelOptions } from '../../src/model/synthetic-model.ts';
import { syntheticModelSpec } from '../../src/model/synthetic-model.ts';

export const ORIGINAL_TYPES = [GgmlType.F32, GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.Q6_K];

/** The weight types to time: the original six and the matrices' types of the benchmark model, or an explicit list. */
export function kernelTypes(model: MakeModelOptions, list: string): GgmlType[] {
  if (list) {
    return list.split(',').map((name) => {
      const t = GgmlType[name.trim().toUpperCase() as keyof typeof GgmlType];
      if (t === undefined || !QUANT_OF_TYPE[t]) throw new Error(`--kernel-types: no WebGPU snippet for '${name}'`);
      return t;
    });
  }
  const inModel = syntheticModelSpec({ ...model, headerOnly: true }).tensors.filter((t) => t.shape.length > 1).map((t) => t.type);
  return [...new Set([...ORIGINAL_TYPES, ...inModel])];
}

/**
 * Decode on the WebGPU stage of a MoE model: weight bytes the kernels read per token (their
 * own accounting, DispatchSpec.reads) beside the audit's active bytes per token and the total.
 */
export async function moeDecodeBytes(path: string, prompt: number[], nDecode: number): Promise<Record<string, number>> {
  const source = await openTensorSource(path);
  const stage = await createNodeWebGpuStage();
  try {
    const config = configFromHeader(source.header);
    await loadRopeFreqFactors(config, source);
    const infos = source.header.tensors.filter((t) => !ROPE_FACTOR_TENSORS.includes(t.name));
    const bytes = await source.read(infos);
    await stage.load({ config, shard: { start: 0, end: config.nLayer }, artifact: path, tensors: infos.map((t) => ({ name: t.name, type: t.type, shape: [...t.shape], bytes: bytes.get(t.name)! })) });
    await stage.openSession('moe', prompt.length + nDecode + 1);
    let out = (await stage.forward('moe', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
    const before = stage.transferStats().weightBytesRead;
    for (let i = 0; i < nDecode; i++) {
      const next = out.kind === 'logits' ? argmax(out.logits) : 0;
      out = (await stage.forward('moe', { kind: 'tokens', tokens: Int32Array.of(next) }, prompt.length + i)).output;
    }
    const audit = auditHeader(source.header, path);
    return {
      total_weight_bytes: infos.reduce((a, t) => a + t.byteLength, 0),
      expert_bytes: audit.expert_bytes,
      active_weight_bytes_per_token: audit.active_weight_bytes_per_token,
      decode_weight_bytes_read_per_token: Math.round((stage.transferStats().weightBytesRead - before) / nDecode),
    };
  } finally {
    await stage.dispose();
    stage.device.destroy();
    await source.close();
  }
}
