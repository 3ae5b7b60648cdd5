// What the peer panel says about a device (src/ui/device-facts.ts), from peer states as a tab
// holds them: where the budget came from, the storage line, the thank-you line, and when it
// advises a native node instead — with the command to run.
import { describe, expect, it } from 'vitest';
import { joiningState } from '../src/peer/browser-stage.ts';
import type { BrowserPeerState } from '../src/peer/browser-stage.ts';
import type { MemoryProbe } from '../src/peer/memory-probe.ts';
import { budgetText, helpedText, nativeNodeAdvice, storageText } from '../src/ui/device-facts.ts';

const MiB = 2 ** 20;
const LINK = 'https://mesh.example/room/r1#secret=s';

function probed(memoryBytes: number, probe: Partial<MemoryProbe>, fallback = false, modelBytes = 4096 * MiB): BrowserPeerState {
  const s = joiningState('r1');
  const full: MemoryProbe = { measuredBytes: 1024 * MiB, offeredBytes: 819 * MiB, capBytes: 8192 * MiB, chunkBytes: 256 * MiB, limitedBy: 'out-of-memory', outOfMemory: 1, buffers: { created: 5, destroyed: 5 }, ms: 40, ...probe };
  s.capabilities = {
    backend: 'webgpu', reason: null, memoryBytes, memorySource: 'probe', memoryProbe: full,
    adapter: { vendor: 'v', architecture: 'a', description: '', isFallbackAdapter: fallback, maxBufferSize: 1024 * MiB, maxStorageBufferBindingSize: 1024 * MiB, features: [] },
  };
  s.modelBytes = modelBytes;
  return s;
}

describe('the peer panel\'s device facts', () => {
  it('says the budget was measured and what stopped the probe, and when it was lowered after a GPU loss', () => {
    expect(budgetText(probed(819 * MiB, {}))).toMatch(/measured: held 1(\.0+)? GiB, stopped by the GPU running out of memory/);
    expect(budgetText(probed(300 * MiB, {}))).toMatch(/lowered after the GPU lost its memory/);
  });

  it('advises a native node, with the command, when the browser is what keeps the device small', () => {
    const advice = nativeNodeAdvice(probed(819 * MiB, {}), LINK);
    expect(advice).toContain(`gguf-mesh node --join '${LINK}'`);
    expect(advice).toMatch(/the browser limits what one tab may keep/);
  });

  it('gives no advice when the tab holds the model, or its probe only reached the cap on a real GPU', () => {
    expect(nativeNodeAdvice(probed(819 * MiB, {}, false, 100 * MiB), LINK)).toBeNull();
    expect(nativeNodeAdvice(probed(6553 * MiB, { measuredBytes: 8192 * MiB, offeredBytes: 6553 * MiB, limitedBy: 'cap' }), LINK)).toBeNull();
  });

  it('says a tab without WebGPU can still serve as a native node', () => {
    const s = joiningState('r1');
    s.capabilities = { backend: 'none', reason: 'no WebGPU', adapter: null, memoryBytes: 0, memorySource: 'estimate', memoryProbe: null };
    expect(nativeNodeAdvice(s, LINK)).toMatch(/cannot serve layers.*gguf-mesh node --join/);
  });

  it('describes the storage and thanks a tab for the bytes it gave', () => {
    const s = probed(819 * MiB, {});
    s.storage = { persisted: false, quotaBytes: 10 * 1024 * MiB, usageBytes: 12 * MiB, evictedUnits: ['layer.3'] };
    expect(storageText(s)).toMatch(/not persistent.*12(\.0+)? MiB of 10(\.0+)? GiB used.*evicted and fetched again: layer\.3/);
    expect(helpedText(s)).toBeNull();
    s.served = { servedTensors: 9, servedBytes: 494848 };
    expect(helpedText(s)).toMatch(/Thank you for helping: this tab sent .* \(9 tensors\)/);
  });
});
