// Failure paths of the WebGPU stage in the page: device loss and limits surface as MeshErrors
// naming the shard, before or instead of a wrong answer.
import { afterAll, describe, expect, it } from 'vitest';
import { acquireDevice } from '../../src/backends/webgpu/device.ts';
import { SHADERS } from '../../src/backends/webgpu/shaders-vite.ts';
import { WebGpuStage } from '../../src/backends/webgpu/stage.ts';
import type { StageModel } from '../../src/backends/webgpu/stage.ts';
import { isMeshError } from '../../src/errors.ts';
import { quantize } from '../../src/gguf/quantize.ts';
import { GgmlType } from '../../src/gguf/types.ts';
import type { ModelConfig } from '../../src/model/config.ts';

const config: ModelConfig = {
  architecture: 'llama',
  nLayer: 1,
  nEmbd: 64,
  nHead: 4,
  nHeadKv: 2,
  headDim: 16,
  nFf: 128,
  nVocab: 32,
  nCtxTrain: 128,
  rmsEps: 1e-5,
  rope: { mode: 'normal', nRot: 16, freqBase: 10000, freqScale: 1, extFactor: 0, attnFactor: 1, betaFast: 32, betaSlow: 1, nCtxOrig: 128, freqFactors: null, freqFactorsTensor: null },
  ropeSwa: null,
  ropeLong: null,
  swaLayers: [false],
  tiedEmbeddings: true,
  qkvBias: false,
  qkNorm: false,
  ffnActivation: 'silu',
  moe: null,
  embedScale: 1,
  postNorms: false,
  queryScale: null,
  slidingWindow: 0,
  finalLogitSoftcap: 0,
  linearAttention: null,
  recurrentLayers: [false],
  attnOutputGate: false,
};

function tensor(name: string, shape: number[], type = GgmlType.Q8_0) {
  const n = shape.reduce((a, b) => a * b, 1);
  const values = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 0.5);
  const t = shape.length === 1 ? GgmlType.F32 : type;
  return { name, type: t, shape, bytes: quantize(t, values, shape[0]) };
}

/** A one-layer model small enough to build in the test. */
function tinyModel(): StageModel {
  const { nEmbd, nFf, nVocab } = config;
  const kv = config.nHeadKv * config.headDim;
  return {
    config,
    shard: { start: 0, end: 1 },
    artifact: 'tiny.gguf',
    tensors: [
      tensor('token_embd.weight', [nEmbd, nVocab]),
      tensor('blk.0.attn_norm.weight', [nEmbd]),
      tensor('blk.0.attn_q.weight', [nEmbd, nEmbd]),
      tensor('blk.0.attn_k.weight', [nEmbd, kv]),
      tensor('blk.0.attn_v.weight', [nEmbd, kv]),
      tensor('blk.0.attn_output.weight', [nEmbd, nEmbd]),
      tensor('blk.0.ffn_norm.weight', [nEmbd]),
      tensor('blk.0.ffn_gate.weight', [nEmbd, nFf]),
      tensor('blk.0.ffn_up.weight', [nEmbd, nFf]),
      tensor('blk.0.ffn_down.weight', [nFf, nEmbd]),
      tensor('output_norm.weight', [nEmbd]),
    ],
  };
}

const stages: WebGpuStage[] = [];
afterAll(async () => {
  for (const s of stages) await s.dispose();
});

async function newStage(): Promise<WebGpuStage> {
  const { device, adapter } = await acquireDevice(navigator.gpu);
  const s = new WebGpuStage(device, adapter, SHADERS);
  stages.push(s);
  return s;
}

const codeOf = (p: Promise<unknown>) => p.then(() => 'no error', (e) => (isMeshError(e) ? e.code : String(e)));

describe('WebGPU stage failure paths', () => {
  it('a lost device fails the next call with WEBGPU_DEVICE_LOST naming the shard', async () => {
    const stage = await newStage();
    await stage.load(tinyModel());
    await stage.openSession('s', 8);
    const first = await stage.forward('s', { kind: 'tokens', tokens: Int32Array.from([1, 2]) }, 0);
    expect(first.output.kind).toBe('logits');
    stage.device.destroy();
    await stage.device.lost;
    const err = await stage.forward('s', { kind: 'tokens', tokens: Int32Array.from([3]) }, 2).catch((e) => e);
    expect(isMeshError(err, 'WEBGPU_DEVICE_LOST')).toBe(true);
    expect((err as Error).message).toContain('shard [0, 1) of tiny.gguf');
  });

  it('one forward is one queue submission and reads back only what leaves the stage', async () => {
    const { device, adapter } = await acquireDevice(navigator.gpu);
    const middle = new WebGpuStage(device, adapter, SHADERS);
    stages.push(middle);
    // a middle stage: layers only, hidden states in and out
    const model = tinyModel();
    model.config = { ...config, nLayer: 3 };
    model.shard = { start: 1, end: 2 };
    model.tensors = model.tensors.filter((t) => t.name.startsWith('blk.')).map((t) => ({ ...t, name: t.name.replace('blk.0.', 'blk.1.') }));
    await middle.load(model);
    await middle.openSession('m', 8);
    const before = middle.transferStats();
    const hidden = Float32Array.from({ length: 3 * config.nEmbd }, (_, i) => Math.cos(i));
    const r = await middle.forward('m', { kind: 'hidden', hidden, nTokens: 3 }, 0);
    const after = middle.transferStats();
    expect(r.output.kind).toBe('hidden');
    expect(after.submissions - before.submissions).toBe(1);
    expect(after.readbackBytes - before.readbackBytes).toBe(3 * config.nEmbd * 4);
  });

  it('concurrent calls on two sessions run one at a time and give what sequential calls give', async () => {
    const stage = await newStage();
    await stage.load(tinyModel());
    const tokens = (ids: number[]) => ({ kind: 'tokens' as const, tokens: Int32Array.from(ids) });
    await Promise.all([stage.openSession('a', 8), stage.openSession('b', 8), stage.openSession('c', 8)]);
    const [a1, b1, a2] = await Promise.all([stage.forward('a', tokens([1, 2, 3]), 0), stage.forward('b', tokens([4]), 0), stage.forward('a', tokens([5]), 3)]);
    await stage.forward('c', tokens([1, 2, 3]), 0);
    const c2 = await stage.forward('c', tokens([5]), 3);
    const logits = (r: typeof a1) => (r.output.kind === 'logits' ? Array.from(r.output.logits) : []);
    expect(logits(a2)).toEqual(logits(c2));
    expect(logits(a1)).not.toEqual(logits(b1));
    expect(stage.sessionStats('a').position).toBe(4);
  });

  it('a KV cache whose one head exceeds the binding limit is refused up front (CONTEXT_TOO_LARGE)', async () => {
    const stage = await newStage();
    await stage.load(tinyModel());
    // (a layer's cache over the limit is split by heads; one head is the smallest part)
    const tooMany = Math.floor(stage.adapter.maxStorageBufferBindingSize / (config.headDim * 4)) + 1;
    expect(await codeOf(stage.openSession('big', tooMany))).toBe('CONTEXT_TOO_LARGE');
  });

  it('a missing tensor fails load with TENSOR_MISSING and leaves no buffers behind', async () => {
    const stage = await newStage();
    const model = tinyModel();
    model.tensors = model.tensors.filter((t) => t.name !== 'blk.0.ffn_down.weight');
    expect(await codeOf(stage.load(model))).toBe('TENSOR_MISSING');
    expect(stage.bufferStats()).toEqual({ count: 0, bytes: 0 });
  });

  it('an unsupported weight type is refused (UNSUPPORTED_TENSOR_TYPE)', async () => {
    const stage = await newStage();
    const model = tinyModel();
    model.tensors[2] = { ...model.tensors[2]!, type: GgmlType.IQ2_XXS };
    expect(await codeOf(stage.load(model))).toBe('UNSUPPORTED_TENSOR_TYPE');
  });
});
