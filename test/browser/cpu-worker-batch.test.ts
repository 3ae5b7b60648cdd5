// The CPU stage as a tab runs it (the engine in a dedicated worker, workers/cpu-stage.ts) in
// headless Chromium: sessions at different positions decoded in one forwardBatch give the same
// logits, bit for bit, as each decoded alone through `forward` on the same worker, on
// stories260K (served by vite from .cache/test-models, linked by webgpu-global-setup.ts).
import { afterAll, describe, expect, it } from 'vitest';
import type { CpuWorkerBackend } from '../../src/backends/cpu/in-worker.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import { cpuBackendInWorker } from '../../workers/cpu-stage.ts';
import { decodeBothWays } from '../support/batch-check.ts';

let source: TensorSource | undefined;
let backend: CpuWorkerBackend | undefined;
afterAll(async () => {
  await backend?.dispose();
  await source?.close();
});

describe('forwardBatch on the worker-backed CPU stage', () => {
  it('sessions decoded in one batch give the same bits as each decoded alone', async () => {
    source = await openTensorSource(`${location.origin}/.cache/test-models/stories260K.gguf`);
    backend = cpuBackendInWorker();
    await backend.load(source, { start: 0, end: 5 });
    const prompts = [[1, 403, 407], [1, 365], [1, 9038, 2501, 263, 931, 29892]].map((p) => p.map((t) => t % 512));
    expect(await decodeBothWays([backend], prompts, 5)).toBeGreaterThan(0);
  }, 60_000);
});
