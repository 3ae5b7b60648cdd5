// What a browser peer would advertise about its WebGPU.
import { describe, expect, it } from 'vitest';
import { probeWebGpu } from '../../src/backends/webgpu/capabilities.ts';

describe('probeWebGpu', () => {
  it('reports the SwiftShader adapter, its limits and a budget from device memory', async () => {
    const p = await probeWebGpu({ deviceMemoryGiB: 8 });
    expect(p.available).toBe(true);
    if (!p.available) return;
    expect(p.adapter.architecture).toBe('swiftshader');
    expect(p.adapter.isFallbackAdapter).toBe(true);
    expect(p.adapter.maxStorageBufferBindingSize).toBeGreaterThanOrEqual(128 * 1024 * 1024);
    expect(p.memoryBudgetBytes).toBe(2 * 1024 ** 3); // a quarter of 8 GiB on a software adapter
  });

  it('takes the user override as is', async () => {
    const p = await probeWebGpu({ memoryBudgetBytes: 12345 });
    expect(p.available && p.memoryBudgetBytes).toBe(12345);
  });

  it('says why when there is no WebGPU', async () => {
    const p = await probeWebGpu({ gpu: undefined });
    expect(p.available).toBe(false);
    if (!p.available) expect(p.reason).toMatch(/navigator\.gpu is missing/);
  });
});
