// What a browser peer can offer: its WebGPU adapter, or — with no WebGPU (missing, disabled, no
// usable GPU) or when asked — the CPU engine in WebAssembly SIMD (slower, but a stage all the
// same), or nothing (a chat client only, saying why). The memory budget comes from the adapter's
// buffer limit or WebAssembly's 4 GiB, and navigator.deviceMemory (which Chromium rounds and
// caps at 8 GiB); the user can override it.

import { simdAvailable } from '../backends/cpu/wasm-asm.ts';

const GiB = 1024 ** 3;
/** weights a CPU stage offers at most: one WebAssembly memory holds 4 GiB, KV caches included */
const CPU_WEIGHTS_MAX = 3 * GiB;

export type ComputePreference = 'auto' | 'webgpu' | 'cpu';

export interface BrowserCapabilities {
  backend: 'webgpu' | 'cpu' | 'none';
  /** why this tab does not use WebGPU (backend 'cpu'), or cannot serve a stage at all ('none') */
  reason: string | null;
  adapter: { vendor: string; architecture: string; description: string; isFallbackAdapter: boolean; maxBufferSize: number; maxStorageBufferBindingSize: number; features: string[] } | null;
  /** bytes offered for weights */
  memoryBytes: number;
  /** cpu: threads the engine computes on (1 unless the page is cross-origin isolated) */
  cpuThreads: number;
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

export async function detectCapabilities(memoryOverride?: number, prefer: ComputePreference = 'auto'): Promise<BrowserCapabilities> {
  const found = prefer === 'cpu' ? { reason: 'the page asked for the CPU engine' } : await webGpuAdapter();
  if ('adapter' in found) {
    const { adapter } = found;
    const info = adapter.info;
    const limits = adapter.limits;
    // at most a few of the largest buffers the adapter allows
    const fromAdapter = 4 * limits.maxBufferSize;
    return {
      backend: 'webgpu',
      reason: null,
      adapter: {
        vendor: info?.vendor ?? '',
        architecture: info?.architecture ?? '',
        description: info?.description ?? '',
        isFallbackAdapter: Boolean((info as { isFallbackAdapter?: boolean } | undefined)?.isFallbackAdapter),
        maxBufferSize: limits.maxBufferSize,
        maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
        features: [...adapter.features].map(String).sort(),
      },
      memoryBytes: Math.round(memoryOverride ?? Math.min(deviceBudget(), fromAdapter)),
      cpuThreads: 1,
    };
  }
  if (prefer === 'webgpu' || !simdAvailable()) {
    const why = prefer === 'webgpu' ? found.reason : `${found.reason}, and WebAssembly SIMD (for the CPU engine) is missing too`;
    return { backend: 'none', reason: why, adapter: null, memoryBytes: 0, cpuThreads: 0 };
  }
  const isolated = (globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated === true;
  return {
    backend: 'cpu',
    reason: `${found.reason}: serving layers on the CPU engine (WebAssembly SIMD)`,
    adapter: null,
    memoryBytes: Math.round(memoryOverride ?? Math.min(deviceBudget(), CPU_WEIGHTS_MAX)),
    cpuThreads: isolated ? Math.max(1, globalThis.navigator.hardwareConcurrency || 1) : 1,
  };
}
