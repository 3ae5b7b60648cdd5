// The WGSL Gated DeltaNet step and fold (shaders/delta_net_step.wgsl, delta_net_fold.wgsl) on
// Dawn in Node (SwiftShader here) against the CPU reference's chunked delta rule, token by
// token over three chunk ends.
import { afterAll, describe, expect, it } from 'vitest';
import { CHUNK, DeltaChunkState, deltaStep } from '../src/backends/cpu/delta-chunk.ts';
import { GpuDeltaNetLayer } from '../src/backends/webgpu/delta-net.ts';
import { acquireDevice } from '../src/backends/webgpu/device.ts';
import { KernelLibrary } from '../src/backends/webgpu/kernels.ts';
import { nodeGpu } from '../src/backends/webgpu/node.ts';
import { loadShaderSources } from '../src/backends/webgpu/shaders-node.ts';
import type { LinearAttentionConfig } from '../src/model/config.ts';
import { Prng } from '../src/model/prng.ts';
import { maxAbsDiff } from './support/llamacpp-oracle.ts';

let device: GPUDevice | null = null;
afterAll(() => device?.destroy());

describe('WGSL Gated DeltaNet step against the CPU reference', () => {
  it(`${3 * CHUNK + 6} tokens, 2 q/k and 4 v heads of 32: every token's output within 1e-4`, async () => {
    const la: LinearAttentionConfig = { convKernel: 4, headDim: 32, nKHeads: 2, nVHeads: 4, convChannels: 2 * 2 * 32 + 4 * 32 };
    const { nVHeads: nV, headDim: d, convChannels: ch, convKernel: K } = la;
    const rng = new Prng(11);
    const rand = (len: number, scale: number) => Float32Array.from({ length: len }, () => scale * rng.normal());
    const taps = rand(ch * K, 0.5);
    device = (await acquireDevice(await nodeGpu(), 'delta-net test')).device;
    const gpu = new GpuDeltaNetLayer(new KernelLibrary(device, loadShaderSources()), la, taps);
    const cpu = new DeltaChunkState(la);
    let worst = 0;
    for (let t = 0; t < 3 * CHUNK + 6; t++) {
      const mixed = rand(ch, 1);
      const g = Float32Array.from(rand(nV, 0.3), (x) => -Math.abs(x) - 0.05);
      const beta = Float32Array.from(rand(nV, 1), (x) => 1 / (1 + Math.exp(-x)));
      const want = new Float32Array(nV * d);
      deltaStep(cpu, taps, { mixed, g, beta }, want, 1e-6, () => undefined);
      const got = await gpu.step(mixed, g, beta, 1e-6);
      worst = Math.max(worst, maxAbsDiff(got, want));
    }
    gpu.dispose();
    console.log(`WGSL delta_net_step/fold vs CPU: max |diff| ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(1e-4);
  }, 120_000);
});
