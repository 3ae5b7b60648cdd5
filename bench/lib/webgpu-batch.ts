// The batched-decode section of `npm run bench -- webgpu` (issue 22 part 6 on a WebGPU stage):
// ./stage-batch.ts on a WebGPU stage (Dawn in this process) holding the whole model.

import { createNodeWebGpuBackend } from '../../src/backends/webgpu/node.ts';
import type { WebGpuStageOptions } from '../../src/backends/webgpu/stage.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import { stageBatchFigure } from './stage-batch.ts';
import type { StageBatchFigure } from './stage-batch.ts';

export type { BatchLevelFigure } from './stage-batch.ts';

export interface BatchedDecodeFigure extends StageBatchFigure {
  kernels: string;
}

export async function batchedDecode(path: string, nLayer: number, vocab: number, levels: number[], rounds: number, options: WebGpuStageOptions = {}): Promise<BatchedDecodeFigure> {
  const source = await openTensorSource(path);
  const stage = await createNodeWebGpuBackend(options);
  try {
    await stage.load(source, { start: 0, end: nLayer });
    const figure = await stageBatchFigure(stage, vocab, levels, rounds);
    return { kernels: `${stage.adapter.isFallbackAdapter ? 'software' : 'hardware'} adapter (${stage.adapter.architecture || stage.adapter.vendor || 'unknown'})${options.matVec ? `, mat-vec ${options.matVec}` : ''}`, ...figure };
  } finally {
    await stage.dispose();
    await source.close();
  }
}
