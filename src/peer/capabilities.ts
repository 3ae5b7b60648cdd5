// What a browser peer can offer: its WebGPU adapter (or why there is none) and a memory budget
// for weights. The budget is measured (memory-probe.ts: GPU buffers allocated and cleared up to
// a cap, then freed) unless the user sets one; navigator.deviceMemory is only the fallback when
// probing fails, since Chromium caps it at 8 and other browsers have none.

import { defaultProbeCap, probeGpuMemory } from './memory-probe.ts';
import type { MemoryProbe } from './memory-probe.ts';

const GiB = 1024 ** 3;

export interface CapabilityOptions {
  /** bytes to offer, as the user set them: no probe */
  memoryBytes?: number;
  /** the most the probe tries (default: defaultProbeCap) */
  probeCapBytes?: number;
  /** one probe buffer's size (default 256 MiB) */
  probeChunkBytes?: number;
}

export interface BrowserCapabilities {
  backend: 'webgpu' | 'none';
  /** why this tab cannot serve a stage (backend 'none') */
  reason: string | null;
  adapter: { vendor: string; architecture: string; description: string; isFallbackAdapter: boolean; maxBufferSize: number; maxStorageBufferBindingSize: number; features: string[] } | null;
  /** bytes offered for weights (lowered after an out-of-memory error or device loss) */
  memoryBytes: number;
  /** where the budget came from: the user, the probe, or navigator.deviceMemory when the probe failed */
  memorySource: 'user' | 'probe' | 'estimate';
  memoryProbe: MemoryProbe | null;
}

const NONE = { adapter: null, memoryBytes: 0, memorySource: 'estimate', memoryProbe: null } as const;

export async function detectCapabilities(opts: CapabilityOptions = {}): Promise<BrowserCapabilities> {
  const gpu = (globalThis.navigator as Navigator & { gpu?: GPU }).gpu;
  if (!gpu) return { backend: 'none', reason: 'this browser has no WebGPU (navigator.gpu is missing)', ...NONE };
  let adapter: GPUAdapter | null = null;
  try {
    adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  } catch (e) {
    return { backend: 'none', reason: `WebGPU adapter request failed: ${(e as Error).message}`, ...NONE };
  }
  if (!adapter) return { backend: 'none', reason: 'WebGPU gave no adapter (disabled, or no usable GPU)', ...NONE };
  const info = adapter.info;
  const limits = adapter.limits;
  const isFallbackAdapter = Boolean((info as { isFallbackAdapter?: boolean } | undefined)?.isFallbackAdapter);
  let memoryProbe: MemoryProbe | null = null;
  let memorySource: BrowserCapabilities['memorySource'] = 'user';
  let memoryBytes = opts.memoryBytes;
  if (memoryBytes === undefined) {
    try {
      memoryProbe = await probeGpuMemory(adapter, { capBytes: opts.probeCapBytes ?? defaultProbeCap({ isFallbackAdapter }), ...(opts.probeChunkBytes ? { chunkBytes: opts.probeChunkBytes } : {}) });
      memoryBytes = memoryProbe.offeredBytes;
      memorySource = 'probe';
    } catch {
      // half of the device's memory, at most a few of the largest buffers the adapter allows
      const deviceMemory = (globalThis.navigator as Navigator & { deviceMemory?: number }).deviceMemory;
      memoryBytes = Math.min(deviceMemory ? (deviceMemory * GiB) / 2 : 2 * GiB, 4 * limits.maxBufferSize);
      memorySource = 'estimate';
    }
  }
  return {
    backend: 'webgpu',
    reason: null,
    adapter: {
      vendor: info?.vendor ?? '',
      architecture: info?.architecture ?? '',
      description: info?.description ?? '',
      isFallbackAdapter,
      maxBufferSize: limits.maxBufferSize,
      maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
      features: [...adapter.features].map(String).sort(),
    },
    memoryBytes: Math.round(memoryBytes),
    memorySource,
    memoryProbe,
  };
}
