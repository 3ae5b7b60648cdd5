// WebGPU in Node through Dawn (the `webgpu` npm package), so `gguf-mesh generate --backend
// webgpu`, the Node tests and the benchmark can run the same stage as a browser tab.
//
// Dawn finds GPUs through the Vulkan loader (libvulkan.so.1). Where the system has none, the
// loader and SwiftShader that ship with Debian's chromium are used: VK_ICD_FILENAMES can be set
// at run time, but the loader library must be loaded before Dawn looks for it — either the
// process was started with LD_LIBRARY_PATH pointing at it, or we preload it by absolute path
// (koffi), after which Dawn's dlopen("libvulkan.so.1") finds it by its soname.

import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { MeshError } from '../../errors.ts';
import { WebGpuBackend } from './backend.ts';
import { acquireDevice } from './device.ts';
import { inThreadEngine } from './engine.ts';
import { loadShaderSources } from './shaders-node.ts';
import { WebGpuStage } from './stage.ts';
import type { WebGpuStageOptions } from './stage.ts';

const CHROMIUM_DIR = process.env.GGUF_MESH_VULKAN_DIR ?? '/usr/lib/chromium';
const SYSTEM_LIB_DIRS = ['/usr/lib/x86_64-linux-gnu', '/usr/lib64', '/usr/lib', '/lib/x86_64-linux-gnu', '/usr/local/lib'];
const SYSTEM_ICD_DIRS = ['/usr/share/vulkan/icd.d', '/etc/vulkan/icd.d', '/usr/local/share/vulkan/icd.d'];

/** Environment a child process needs to reach SwiftShader through chromium's Vulkan loader. */
export function dawnEnvironment(): Record<string, string> {
  return {
    LD_LIBRARY_PATH: [CHROMIUM_DIR, process.env.LD_LIBRARY_PATH].filter(Boolean).join(':'),
    VK_ICD_FILENAMES: process.env.VK_ICD_FILENAMES ?? join(CHROMIUM_DIR, 'vk_swiftshader_icd.json'),
  };
}

let gpuPromise: Promise<GPU> | null = null;

/** Dawn's GPU object, with WebGPU's global constants (GPUBufferUsage, …) installed. */
export function nodeGpu(): Promise<GPU> {
  gpuPromise ??= (async () => {
    await prepareVulkanLoader();
    const { create, globals } = await import('webgpu');
    Object.assign(globalThis, globals);
    return create([]) as GPU;
  })();
  return gpuPromise;
}

async function prepareVulkanLoader(): Promise<void> {
  const systemIcd = SYSTEM_ICD_DIRS.some((d) => existsSync(d));
  const chromiumIcd = join(CHROMIUM_DIR, 'vk_swiftshader_icd.json');
  if (!process.env.VK_ICD_FILENAMES && !systemIcd && existsSync(chromiumIcd)) process.env.VK_ICD_FILENAMES = chromiumIcd;

  const inPath = (process.env.LD_LIBRARY_PATH ?? '').split(':').filter(Boolean);
  const hasLoader = [...inPath, ...SYSTEM_LIB_DIRS].some((d) => existsSync(join(d, 'libvulkan.so.1')));
  if (hasLoader) return;
  const chromiumLoader = join(CHROMIUM_DIR, 'libvulkan.so.1');
  if (!existsSync(chromiumLoader)) {
    throw new MeshError('WEBGPU_UNAVAILABLE', 'no Vulkan loader (libvulkan.so.1) on this machine: install libvulkan1 and a Vulkan driver, or Debian\'s chromium (for SwiftShader)');
  }
  try {
    const koffi = (await import('koffi')).default;
    koffi.load(chromiumLoader);
  } catch (e) {
    const env = dawnEnvironment();
    throw new MeshError(
      'WEBGPU_UNAVAILABLE',
      `cannot preload ${chromiumLoader} (${(e as Error).message}); start the process with LD_LIBRARY_PATH=${env.LD_LIBRARY_PATH} VK_ICD_FILENAMES=${env.VK_ICD_FILENAMES}`,
    );
  }
}

/**
 * Dawn's GPU object that answers with an adapter. A Dawn instance over SwiftShader has been seen
 * to come up with no adapter at all (every request on it answers null) in test worker processes,
 * while a fresh instance in the same process finds one; so a GPU that finds none is replaced, a
 * few times, before WebGPU is declared unavailable.
 */
async function nodeGpuWithAdapter(): Promise<GPU> {
  for (let attempt = 0; attempt < 3; attempt++) {
    const gpu = await nodeGpu();
    if (await gpu.requestAdapter({ powerPreference: 'high-performance' })) return gpu;
    gpuPromise = null;
    await new Promise((r) => setTimeout(r, 100 * (attempt + 1)));
  }
  return nodeGpu();
}

/** A WebGPU stage running in this Node process on Dawn. */
export async function createNodeWebGpuStage(options: WebGpuStageOptions = {}): Promise<WebGpuStage> {
  const { device, adapter } = await acquireDevice(await nodeGpuWithAdapter(), 'gguf-mesh stage (node)');
  return new WebGpuStage(device, adapter, loadShaderSources(), options);
}

/**
 * The StageBackend for Node. Hook for `gguf-mesh generate --backend webgpu` (generate.ts):
 *   const stage = opts.backend === 'webgpu' ? await createNodeWebGpuBackend() : new CpuBackend(…);
 */
export async function createNodeWebGpuBackend(options: WebGpuStageOptions = {}): Promise<WebGpuBackend> {
  const stage = await createNodeWebGpuStage(options);
  return new WebGpuBackend(inThreadEngine(stage), () => stage.device.destroy(), options.kvType);
}
