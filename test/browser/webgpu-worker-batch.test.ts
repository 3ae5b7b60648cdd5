// The WebGPU stage as a tab runs it (the GPU work in a dedicated worker, workers/webgpu-stage.ts)
// in headless Chromium on SwiftShader: sessions at different positions (one just opened) decoded
// in one forwardBatch give the same logits, bit for bit, as each decoded alone through `forward`
// on the same worker, on stories260K (served by vite from .cache/test-models, linked by
// webgpu-global-setup.ts); a batch that cannot run changes no session.
import { afterAll, describe, expect, it } from 'vitest';
import type { WebGpuBackend } from '../../src/backends/webgpu/backend.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import { webGpuBackendInWorker } from '../../workers/webgpu-stage.ts';
import { decodeBothWays, expectRefusedBatchesChangeNothing } from '../support/batch-check.ts';

let source: TensorSource | undefined;
let backend: WebGpuBackend | undefined;
afterAll(async () => {
  await backend?.dispose();
  await source?.close();
});

describe('forwardBatch on the worker-backed WebGPU stage', () => {
  it('sessions decoded in one batch give the same bits as each decoded alone; a refused batch changes none', async () => {
    source = await openTensorSource(`${location.origin}/.cache/test-models/stories260K.gguf`);
    backend = await webGpuBackendInWorker();
    await backend.load(source, { start: 0, end: 5 });
    const prompts = [[1, 403, 407], [], [1, 9038, 2501, 263, 931, 29892].map((t) => t % 512)]; // one just opened: its first token comes in a batch
    expect(await decodeBothWays([backend], prompts, 4)).toBeGreaterThan(0);
    // refusals cross the worker with their codes, and move no session
    await expectRefusedBatchesChangeNothing(backend);
  }, 60_000);
});
