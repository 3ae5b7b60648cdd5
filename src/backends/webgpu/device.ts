// Getting a GPUDevice: ask for the adapter's optional features we can use (shader-f16,
// subgroups) only when it has them, and for its full storage-binding limits, so large
// weight matrices need as few splits as the hardware allows.

import { MeshError } from '../../errors.ts';

export interface AdapterSummary {
  vendor: string;
  architecture: string;
  description: string;
  /** a software adapter (SwiftShader, WARP): barriers are slow there, so kernels choose accordingly */
  isFallbackAdapter: boolean;
  features: string[];
  maxStorageBufferBindingSize: number;
  maxBufferSize: number;
}

export interface AcquiredDevice {
  device: GPUDevice;
  adapter: AdapterSummary;
}

const OPTIONAL_FEATURES: GPUFeatureName[] = ['shader-f16', 'subgroups' as GPUFeatureName];

export async function acquireDevice(gpu: GPU | undefined, label = 'gguf-mesh stage'): Promise<AcquiredDevice> {
  if (!gpu) throw new MeshError('WEBGPU_UNAVAILABLE', 'WebGPU is not available here (navigator.gpu is missing)');
  const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) throw new MeshError('WEBGPU_UNAVAILABLE', 'WebGPU gave no adapter');
  const requiredFeatures = OPTIONAL_FEATURES.filter((f) => adapter.features.has(f));
  const limits = adapter.limits;
  const device = await adapter.requestDevice({
    label,
    requiredFeatures,
    requiredLimits: {
      maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
      maxBufferSize: limits.maxBufferSize,
    },
  });
  const info = adapter.info;
  return {
    device,
    adapter: {
      vendor: info?.vendor ?? '',
      architecture: info?.architecture ?? '',
      description: info?.description ?? '',
      isFallbackAdapter: Boolean((info as { isFallbackAdapter?: boolean } | undefined)?.isFallbackAdapter ?? (adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter),
      features: [...device.features].map(String).sort(),
      maxStorageBufferBindingSize: device.limits.maxStorageBufferBindingSize,
      maxBufferSize: device.limits.maxBufferSize,
    },
  };
}
