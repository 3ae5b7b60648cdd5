// The WGSL Gated DeltaNet step and fold (shaders/delta_net_step.wgsl, delta_net_fold.wgsl) on
// Dawn in Node (SwiftShader here) against the CPU reference's chunked delta rule, token by
// token over three chunk ends, then the same tokens in batches that start mid-chunk.
import { afterAll, describe, expect, it } from 'vitest';
import { CHUNK, DeltaChunkState, deltaStep } from '../src/backends/cpu/delta-chunk.ts';
import { deltaInputWidth, GpuDeltaState, recordDeltaTokens } from '../src/backends/webgpu/delta-net.ts';
import { acquireDevice } from '../src/backends/webgpu/device.ts';
import { GpuMemory } from '../src/backends/webgpu/gpu-memory.ts';
import { KernelLibrary, Recorder, SubmitResources } from '../src/backends/webgpu/kernels.ts';
import { nodeGpu } from '../src/backends/webgpu/node.ts';
import { loadShaderSources } from '../src/backends/webgpu/shaders-node.ts';
import { BufferUsage } from '../src/backends/webgpu/usage.ts';
import type { LinearAttentionConfig } from '../src/model/config.ts';
import { Prng } from '../src/model/prng.ts';
import { maxAbsDiff } from './support/llamacpp-oracle.ts';

let device: GPUDevice | null = null;
afterAll(() => device?.destroy());

const la: LinearAttentionConfig = { convKernel: 4, headDim: 32, nKHeads: 2, nVHeads: 4, convChannels: 2 * 2 * 32 + 4 * 32 };
const TOKENS = 3 * CHUNK + 6;

describe('WGSL Gated DeltaNet step against the CPU reference', () => {
  it(`${TOKENS} tokens, 2 q/k and 4 v heads of 32, one at a time and in batches of 7: every token's output within 1e-4`, async () => {
    const { nVHeads: nV, headDim: d, convChannels: ch, convKernel: K } = la;
    const rng = new Prng(11);
    const rand = (len: number, scale: number) => Float32Array.from({ length: len }, () => scale * rng.normal());
    const taps = rand(ch * K, 0.5);
    // per token [mixed | g | β], and the CPU's outputs
    const width = deltaInputWidth(la);
    const inputs = new Float32Array(TOKENS * width);
    const want = new Float32Array(TOKENS * nV * d);
    const cpu = new DeltaChunkState(la);
    for (let t = 0; t < TOKENS; t++) {
      const mixed = rand(ch, 1);
      const g = Float32Array.from(rand(nV, 0.3), (x) => -Math.abs(x) - 0.05);
      const beta = Float32Array.from(rand(nV, 1), (x) => 1 / (1 + Math.exp(-x)));
      inputs.set(mixed, t * width);
      inputs.set(g, t * width + ch);
      inputs.set(beta, t * width + ch + nV);
      deltaStep(cpu, taps, { mixed, g, beta }, want.subarray(t * nV * d, (t + 1) * nV * d), 1e-6, () => undefined);
    }
    device = (await acquireDevice(await nodeGpu(), 'delta-net test')).device;
    const memory = new GpuMemory(device);
    const lib = new KernelLibrary(device, loadShaderSources());
    const resources = new SubmitResources(memory);
    const tapsBuf = memory.upload('taps', taps);
    const out = memory.create('o', TOKENS * nV * d * 4, BufferUsage.STORAGE | BufferUsage.COPY_SRC);
    const run = async (batch: number) => {
      const st = new GpuDeltaState(memory, 'test', la);
      const got = new Float32Array(TOKENS * nV * d);
      for (let t0 = 0; t0 < TOKENS; t0 += batch) {
        const n = Math.min(batch, TOKENS - t0);
        const inBuf = memory.upload('inputs', inputs.subarray(t0 * width, (t0 + n) * width));
        const rec = new Recorder(lib, resources);
        recordDeltaTokens(rec, st, tapsBuf, inBuf, out, n, t0 % CHUNK, 1e-6);
        got.set(new Float32Array((await rec.submit({ buffer: out, offset: 0, bytes: n * nV * d * 4 }))!), t0 * nV * d);
        memory.destroy(inBuf);
      }
      st.free();
      return maxAbsDiff(got, want);
    };
    const single = await run(1);
    const batched = await run(7);
    resources.dispose();
    memory.destroyAll();
    console.log(`WGSL delta_net_step/fold vs CPU: max |diff| ${single.toExponential(2)} one at a time, ${batched.toExponential(2)} in batches of 7`);
    expect(single).toBeLessThan(1e-4);
    expect(batched).toBeLessThan(1e-4);
  }, 120_000);
});
