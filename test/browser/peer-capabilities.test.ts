// What a browser peer advertises, from the real adapter in headless Chromium (SwiftShader): the
// adapter and a measured memory budget (GPU buffers allocated, cleared and freed again).
import { describe, expect, it } from 'vitest';
import { detectCapabilities } from '../../src/peer/capabilities.ts';
import { budgetAfterFailure, defaultProbeCap, PROBE_HEADROOM, probeGpuMemory } from '../../src/peer/memory-probe.ts';

const MiB = 1024 ** 2;

async function adapter(): Promise<GPUAdapter> {
  const a = await navigator.gpu.requestAdapter();
  if (!a) throw new Error('no WebGPU adapter in this Chromium');
  return a;
}

describe('detectCapabilities', () => {
  it('reports the WebGPU adapter and a budget it measured, within the software adapter\'s probe cap', async () => {
    const c = await detectCapabilities({ probeCapBytes: 64 * MiB, probeChunkBytes: 16 * MiB });
    expect(c.backend).toBe('webgpu');
    expect(c.reason).toBeNull();
    expect(c.adapter!.maxBufferSize).toBeGreaterThan(0);
    expect(c.adapter!.architecture).toBe('swiftshader');
    expect(c.memorySource).toBe('probe');
    expect(c.memoryProbe!.measuredBytes).toBe(64 * MiB);
    expect(c.memoryBytes).toBe(Math.floor(64 * MiB * (1 - PROBE_HEADROOM)));
  });

  it('takes the user\'s memory budget and probes nothing', async () => {
    const c = await detectCapabilities({ memoryBytes: 3 * 2 ** 30 });
    expect(c.memoryBytes).toBe(3 * 2 ** 30);
    expect(c.memorySource).toBe('user');
    expect(c.memoryProbe).toBeNull();
  });
});

describe('probeGpuMemory', () => {
  it('holds buffers up to the cap, then frees every one of them', async () => {
    const a = await adapter();
    const p = await probeGpuMemory(a, { capBytes: 48 * MiB, chunkBytes: 16 * MiB });
    expect(p.limitedBy).toBe('cap');
    expect(p.outOfMemory).toBe(0);
    expect(p.measuredBytes).toBe(48 * MiB);
    expect(p.buffers).toEqual({ created: 3, destroyed: 3 });
  });

  it('halves its buffers when the adapter answers out-of-memory, and counts only what it held', async () => {
    const a = await adapter();
    // SwiftShader refuses one buffer of its full maxBufferSize (1 GiB) as out of memory, yet holds two halves
    const p = await probeGpuMemory(a, { capBytes: a.limits.maxBufferSize, chunkBytes: 4 * a.limits.maxBufferSize });
    expect(p.chunkBytes).toBe(a.limits.maxBufferSize);
    expect(p.outOfMemory).toBeGreaterThanOrEqual(1);
    expect(p.measuredBytes).toBeLessThanOrEqual(a.limits.maxBufferSize);
    expect(p.measuredBytes).toBeGreaterThanOrEqual(a.limits.maxBufferSize / 2);
    expect(p.buffers.created).toBe(p.buffers.destroyed);
  }, 60_000);

  it('rounds a chunk to whole words and never goes past the cap', async () => {
    const a = await adapter();
    // clearBuffer takes whole words; a cap below one chunk makes the chunk the cap
    const p = await probeGpuMemory(a, { capBytes: 6 * MiB, chunkBytes: 8 * MiB + 3 });
    expect(p.chunkBytes % 4).toBe(0);
    expect(p.chunkBytes).toBe(6 * MiB);
    expect(p.measuredBytes).toBe(6 * MiB);
  });

  it('probes a software adapter little and a phone under its browser\'s own figure', () => {
    expect(defaultProbeCap({ isFallbackAdapter: true })).toBe(128 * MiB);
    expect(defaultProbeCap({ isFallbackAdapter: false }, { deviceMemory: 3, userAgentData: { mobile: true } })).toBe(1.5 * 1024 * MiB);
    expect(defaultProbeCap({ isFallbackAdapter: false }, { userAgent: 'Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X)' })).toBe(1024 * MiB);
    expect(defaultProbeCap({ isFallbackAdapter: false }, { deviceMemory: 8, userAgentData: { mobile: false } })).toBe(8 * 1024 * MiB);
  });

  it('lowers a budget below the shard that failed, halving at least', () => {
    expect(budgetAfterFailure(1000, 800)).toBe(500);
    expect(budgetAfterFailure(1000, 400)).toBe(300);
    expect(budgetAfterFailure(1, 1)).toBe(0);
  });
});
