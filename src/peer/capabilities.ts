// What a browser peer can offer: its WebGPU adapter, or — with no WebGPU (missing, disabled, no
// usable GPU) or when asked — the CPU engine in WebAssembly SIMD (slower, but a stage all the
// same), or nothing (a chat client only, saying why); and a memory budget for weights. With
// WebGPU the budget is measured (memory-probe.ts: GPU buffers allocated and cleared up to a cap,
// then freed) unless the user sets one; navigator.deviceMemory is only the fallback when probing
// fails, since Chromium caps it at 8 and other browsers have none. The CPU engine's budget is
// half the device's memory, under WebAssembly's 4 GiB.

import { simdAvailable } from '../backends/cpu/wasm-asm.ts';
import { defaultProbeCap, probeGpuMemory } from './memory-probe.ts';
import type { MemoryProbe } from './memory-probe.ts';

const GiB = 1024 ** 3;
/** weights a CPU stage offers at most: one WebAssembly memory holds 4 GiB, KV caches included */
const CPU_WEIGHTS_MAX = 3 * GiB;

export type ComputePreference = 'auto' | 'webgpu' | 'cpu';

export interface CapabilityOptions {
  /** bytes to offer, as the user set them: no probe */
  memoryBytes?: number;
  /** the most the probe tries (default: defaultProbeCap) */
  probeCapBytes?: number;
  /** one probe buffer's size (default 256 MiB) */
  probeChunkBytes?: number;
  /** 'auto' (default): WebGPU where the tab has an adapter, else the CPU engine; or force one */
  prefer?: ComputePreference;
}

export interface BrowserCapabilities {
  backend: 'webgpu' | 'cpu' | 'none';
  /** why this tab does not use WebGPU (backend 'cpu'), or cannot serve a stage at all ('none') */
  reason: string | null;
  adapter: { vendor: string; architecture: string; description: string; isFallbackAdapter: boolean; maxBufferSize: number; maxStorageBufferBindingSize: number; features: string[] } | null;
  /** bytes offered for weights (lowered after an out-of-memory error or device loss) */
  memoryBytes: number;
  /** where the budget came from: the user, the probe, or navigator.deviceMemory when the probe failed (or for the CPU engine) */
  memorySource: 'user' | 'probe' | 'estimate';
  memoryProbe: MemoryProbe | null;
  /** cpu: threads the engine computes on (1 unless the page is cross-origin isolated) */
  cpuThreads?: number;
}

/** half of the device's memory (2 GiB where the browser does not say) */
function deviceBudget(): number {
  const deviceMemory = (globalThis.navigator as Navigator & { deviceMemory?: number }).deviceMemory;
  return deviceMemory ? (deviceMemory * GiB) / 2 : 2 * GiB;
}

/** The WebGPU adapter, or why there is none. */
async function webGpuAdapter(): Promise<{ adapter: GPUAdapter } | { reason: string }> {
  const gpu = (globalThis.navigator as Navigator & { gpu?: GPU }).gpu;
  if (!gpu) return { reason: 'this browser has no WebGPU (navigator.gpu is missing)' };
  try {
    const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
    return adapter ? { adapter } : { reason: 'WebGPU gave no adapter (disabled, or no usable GPU)' };
  } catch (e) {
    return { reason: `WebGPU adapter request failed: ${(e as Error).message}` };
  }
}

export async function detectCapabilities(opts: CapabilityOptions = {}): Promise<BrowserCapabilities> {
  const prefer = opts.prefer ?? 'auto';
  const found = prefer === 'cpu' ? { reason: 'the page asked for the CPU engine' } : await webGpuAdapter();
  if ('adapter' in found) return webGpuCapabilities(found.adapter, opts);
  if (prefer === 'webgpu' || !simdAvailable()) {
    const why = prefer === 'webgpu' ? found.reason : `${found.reason}, and WebAssembly SIMD (for the CPU engine) is missing too`;
    return { backend: 'none', reason: why, adapter: null, memoryBytes: 0, memorySource: 'estimate', memoryProbe: null, cpuThreads: 0 };
  }
  const isolated = (globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated === true;
  return {
    backend: 'cpu',
    reason: `${found.reason}: serving layers on the CPU engine (WebAssembly SIMD)`,
    adapter: null,
    memoryBytes: Math.round(opts.memoryBytes ?? Math.min(deviceBudget(), CPU_WEIGHTS_MAX)),
    memorySource: opts.memoryBytes !== undefined ? 'user' : 'estimate',
    memoryProbe: null,
    cpuThreads: isolated ? Math.max(1, globalThis.navigator.hardwareConcurrency || 1) : 1,
  };
}

async function webGpuCapabilities(adapter: GPUAdapter, opts: CapabilityOptions): Promise<BrowserCapabilities> {
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
      memoryBytes = Math.min(deviceBudget(), 4 * limits.maxBufferSize);
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
    cpuThreads: 1,
  };
}
