// WebGPU reports allocation failures and misuse asynchronously, through error scopes; this runs a
// step of the stage inside them, so either becomes a MeshError naming the shard and the step
// instead of a silent wrong answer.

import { MeshError } from '../../errors.ts';

/**
 * Runs `fn` inside out-of-memory and validation error scopes. `lost` says why the device was
 * lost, or null while it is not.
 */
export async function withErrorScopes<T>(device: GPUDevice, lost: () => string | null, where: string, doing: string, fn: () => Promise<T>): Promise<T> {
  device.pushErrorScope('out-of-memory');
  device.pushErrorScope('validation');
  let result: T;
  let failure: unknown = null;
  try {
    result = await fn();
  } catch (e) {
    failure = e;
  }
  const validation = await device.popErrorScope();
  const oom = await device.popErrorScope();
  const lostReason = lost();
  if (lostReason) throw new MeshError('WEBGPU_DEVICE_LOST', `the WebGPU device was lost (${lostReason}) while ${doing} on ${where}`);
  if (oom) throw new MeshError('WEBGPU_OUT_OF_MEMORY', `out of GPU memory while ${doing} on ${where}: ${oom.message}`);
  if (validation) throw new MeshError('WEBGPU_ERROR', `WebGPU rejected a command while ${doing} on ${where}: ${validation.message}`);
  if (failure) throw failure;
  return result!;
}
