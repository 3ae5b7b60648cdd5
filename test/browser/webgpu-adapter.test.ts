// The browser project's ground truth: headless Chromium here must hand out a WebGPU adapter,
// in the page and inside a module worker, or no WebGPU test below means anything.
import { describe, expect, it } from 'vitest';

describe('WebGPU in headless Chromium', () => {
  it('gives an adapter and a device in the page', async () => {
    expect(navigator.gpu, 'navigator.gpu is missing: launch Chromium with --enable-unsafe-webgpu').toBeDefined();
    const adapter = await navigator.gpu.requestAdapter();
    expect(adapter).not.toBeNull();
    const device = await adapter!.requestDevice();
    expect(device.limits.maxStorageBufferBindingSize).toBeGreaterThanOrEqual(128 * 1024 * 1024);
    device.destroy();
  });

  it('gives an adapter inside a dedicated module worker', async () => {
    const src = `self.onmessage = async () => {
      const a = await navigator.gpu?.requestAdapter();
      self.postMessage(a ? 'ok' : 'none');
    };`;
    const url = URL.createObjectURL(new Blob([src], { type: 'text/javascript' }));
    const worker = new Worker(url, { type: 'module' });
    const answer = await new Promise<string>((resolve) => {
      worker.onmessage = (e) => resolve(e.data as string);
      worker.postMessage('go');
    });
    worker.terminate();
    expect(answer).toBe('ok');
  });
});
