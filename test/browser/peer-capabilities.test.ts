// What a browser peer advertises, from the real adapter in headless Chromium (SwiftShader).
import { describe, expect, it } from 'vitest';
import { detectCapabilities } from '../../src/peer/capabilities.ts';

describe('detectCapabilities', () => {
  it('reports the WebGPU adapter and a memory budget bounded by its buffer limit', async () => {
    const c = await detectCapabilities();
    expect(c.backend).toBe('webgpu');
    expect(c.reason).toBeNull();
    expect(c.adapter!.maxBufferSize).toBeGreaterThan(0);
    expect(c.adapter!.architecture).toBe('swiftshader');
    expect(c.memoryBytes).toBeGreaterThan(0);
    expect(c.memoryBytes).toBeLessThanOrEqual(4 * c.adapter!.maxBufferSize);
  });

  it('takes the user\'s memory budget over the estimate', async () => {
    expect((await detectCapabilities(3 * 2 ** 30)).memoryBytes).toBe(3 * 2 ** 30);
  });
});
