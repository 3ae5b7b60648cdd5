// The CPU stage as a tab runs it (the engine in a dedicated worker, workers/cpu-stage.ts) in
// headless Chromium: sessions at different positions decoded in one forwardBatch give the same
// logits, bit for bit, as each decoded alone through `forward` on the same worker, on
// stories260K (served by vite from .cache/test-models, linked by webgpu-global-setup.ts).
import { afterAll, describe, expect, it } from 'vitest';
import type { CpuWorkerBackend } from '../../src/backends/cpu/in-worker.ts';
import { argmax } from '../../src/backends/cpu/ops.ts';
import type { ForwardResult } from '../../src/backends/types.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import { cpuBackendInWorker } from '../../workers/cpu-stage.ts';

let source: TensorSource | undefined;
let backend: CpuWorkerBackend | undefined;
afterAll(async () => {
  await backend?.dispose();
  await source?.close();
});

function logits(r: ForwardResult): Uint32Array {
  if (r.output.kind !== 'logits') throw new Error('the whole model answers logits');
  return new Uint32Array(r.output.logits.buffer, r.output.logits.byteOffset, r.output.logits.length);
}

describe('forwardBatch on the worker-backed CPU stage', () => {
  it('sessions decoded in one batch give the same bits as each decoded alone', async () => {
    source = await openTensorSource(`${location.origin}/.cache/test-models/stories260K.gguf`);
    backend = cpuBackendInWorker();
    await backend.load(source, { start: 0, end: 5 });
    const prompts = [[1, 403, 407], [1, 365], [1, 9038, 2501, 263, 931, 29892]].map((p) => p.map((t) => t % 512));
    const next: number[] = [];
    for (const [i, p] of prompts.entries()) {
      for (const id of [`ref-${i}`, `bat-${i}`]) {
        await backend.openSession(id, { contextLength: 32 });
        const r = await backend.forward(id, { kind: 'tokens', tokens: Int32Array.from(p) }, 0);
        if (r.output.kind === 'logits') next[i] = argmax(r.output.logits);
      }
    }
    for (let step = 0; step < 5; step++) {
      const positions = prompts.map((_, i) => backend!.sessionStats(`ref-${i}`).position);
      const ref: ForwardResult[] = [];
      for (const [i] of prompts.entries()) ref.push(await backend.forward(`ref-${i}`, { kind: 'tokens', tokens: Int32Array.of(next[i]!) }, positions[i]!));
      const bat = await backend.forwardBatch(prompts.map((_, i) => ({ sessionId: `bat-${i}`, input: { kind: 'tokens', tokens: Int32Array.of(next[i]!) }, position: positions[i]!, outDtype: 'f32' })));
      for (const [i] of prompts.entries()) {
        expect(logits(bat[i]!)).toEqual(logits(ref[i]!));
        expect(backend.sessionStats(`bat-${i}`)).toEqual(backend.sessionStats(`ref-${i}`));
        const r = ref[i]!.output;
        if (r.kind === 'logits') next[i] = argmax(r.logits);
      }
    }
  }, 60_000);
});
