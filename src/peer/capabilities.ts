// What a browser peer can offer: its WebGPU adapter (or why there is none) and a memory budget
// for weights. The budget comes from the adapter's buffer limit and navigator.deviceMemory
// (which Chromium rounds and caps at 8 GiB), and the user can override it.

const GiB = 1024 ** 3;

export interface BrowserCapabilities {
  backend: 'webgpu' | 'none';
  /** why this tab cannot serve a stage (backend 'none') */
  reason: string | null;
  adapter: { vendor: string; architecture: string; description: string; isFallbackAdapter: boolean; maxBufferSize: number; maxStorageBufferBindingSize: number; features: string[] } | null;
  /** bytes offered for weights */
  memoryBytes: number;
}

export async function detectCapabilities(memoryOverride?: number): Promise<BrowserCapabilities> {
  const gpu = (globalThis.navigator as Navigator & { gpu?: GPU }).gpu;
  if (!gpu) return { backend: 'none', reason: 'this browser has no WebGPU (navigator.gpu is missing)', adapter: null, memoryBytes: 0 };
  let adapter: GPUAdapter | null = null;
  try {
    adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  } catch (e) {
    return { backend: 'none', reason: `WebGPU adapter request failed: ${(e as Error).message}`, adapter: null, memoryBytes: 0 };
  }
  if (!adapter) return { backend: 'none', reason: 'WebGPU gave no adapter (disabled, or no usable GPU)', adapter: null, memoryBytes: 0 };
  const info = adapter.info;
  const limits = adapter.limits;
  const deviceMemory = (globalThis.navigator as Navigator & { deviceMemory?: number }).deviceMemory;
  // half of the device's memory, at most a few of the largest buffers the adapter allows
  const fromDevice = deviceMemory ? (deviceMemory * GiB) / 2 : 2 * GiB;
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
    memoryBytes: Math.round(memoryOverride ?? Math.min(fromDevice, fromAdapter)),
  };
}
