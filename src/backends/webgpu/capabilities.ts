// What a browser peer advertises about its WebGPU: the adapter and its limits, and a memory
// budget for shards — or why it cannot serve (then the tab joins as a client only).
// WebGPU does not reveal how much memory a GPU has, so the budget is a guess from
// navigator.deviceMemory (which browsers round and cap at 8 GiB) and the buffer limits; the
// user can override it.

import { acquireDevice } from './device.ts';
import type { AdapterSummary } from './device.ts';

export type WebGpuProbe =
  | { available: true; adapter: AdapterSummary; memoryBudgetBytes: number }
  | { available: false; reason: string };

const GiB = 1024 ** 3;
/** assumed when navigator.deviceMemory is missing (Firefox, Safari, Node) */
const DEFAULT_DEVICE_MEMORY_GIB = 4;

export interface ProbeOptions {
  /** the user's own budget, in bytes: used as is */
  memoryBudgetBytes?: number;
  /** navigator.gpu by default (tests pass undefined to see the "no WebGPU" answer) */
  gpu?: GPU | undefined;
  deviceMemoryGiB?: number;
}

export async function probeWebGpu(options: ProbeOptions = {}): Promise<WebGpuProbe> {
  const nav = globalThis.navigator as (Navigator & { deviceMemory?: number }) | undefined;
  const gpu = 'gpu' in options ? options.gpu : nav?.gpu;
  if (!gpu) return { available: false, reason: 'this browser exposes no WebGPU (navigator.gpu is missing; Chromium needs a secure context, and on Linux --enable-unsafe-webgpu)' };
  let adapter: AdapterSummary;
  try {
    const acquired = await acquireDevice(gpu, 'gguf-mesh probe');
    adapter = acquired.adapter;
    acquired.device.destroy();
  } catch (e) {
    return { available: false, reason: `WebGPU is present but unusable: ${(e as Error).message}` };
  }
  if (options.memoryBudgetBytes !== undefined) return { available: true, adapter, memoryBudgetBytes: options.memoryBudgetBytes };
  const deviceGiB = options.deviceMemoryGiB ?? nav?.deviceMemory ?? DEFAULT_DEVICE_MEMORY_GIB;
  // a software adapter shares the CPU's memory with everything else in the tab; a GPU has its own
  const share = adapter.isFallbackAdapter ? 0.25 : 0.5;
  const memoryBudgetBytes = Math.floor(Math.min(deviceGiB * GiB * share, adapter.maxBufferSize * 16));
  return { available: true, adapter, memoryBudgetBytes };
}
