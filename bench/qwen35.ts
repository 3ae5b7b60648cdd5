// `npm run bench -- qwen35 [--threads N] [--layers N] [--webgpu]`: a synthetic qwen35moe at Qwen3.5-35B-A3B's
// per-head shapes scaled down to fit this machine (half the width: n_embd 1024, 8 q / 1 KV
// heads of 256 with 64 rotated dims, DeltaNet 8 q/k / 16 v heads of 128, 32 experts of 256
// with 8 used and a shared expert of 256; 8 blocks, every 4th full attention; Q8_0). Decode
// bytes of weights read per token, prompt and decode tok/s of the CPU reference and of
// llama.cpp (libllama through FFI, same threads) measured in the same run with their ratio,
// and the state memory per session: measured on this model, and computed at the real shapes
// against the audit's figure (20,480 B/token f16 KV on the 10 attention blocks + 62.8 MiB of
// fixed f32 state on the 30 DeltaNet blocks). --webgpu also times the WebGPU stage (Dawn: on
// this machine SwiftShader, a CPU rasteriser, so its figure is not a GPU's).
import { parseArgs } from 'node:util';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { deltaLayerBytes } from '../src/backends/cpu/delta-chunk.ts';
import { LlamaModelFfi } from '../src/backends/llamacpp/ffi.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { gpuDeltaLayerBytes } from '../src/backends/webgpu/delta-net.ts';
import { createNodeWebGpuBackend } from '../src/backends/webgpu/node.ts';
import { isExpertTensor } from '../src/gguf/summary.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { GgufHeader } from '../src/gguf/types.ts';
import { configFromHeader } from '../src/model/config.ts';
import type { LinearAttentionConfig, ModelConfig } from '../src/model/config.ts';
import { argmax } from '../src/model/sampler.ts';
import type { MakeModelOptions } from '../src/model/synthetic-model.ts';
import { syntheticModel } from '../test/support/synthetic.ts';
import { timeBare } from './engine.ts';

const round = (x: number) => Math.round(x * 100) / 100;
const REPEATS = 2;

/** the real model's per-head shapes at half its width */
function benchModel(layers: number): MakeModelOptions {
  return {
    arch: 'qwen35moe', layers, embd: 1024, heads: 8, kvHeads: 1, headDim: 256, ropeDims: 64,
    linearKHeads: 8, linearVHeads: 16, linearHeadDim: 128, experts: 32, expertsUsed: 8, expertFfn: 256, sharedFfn: 256,
    ffn: 256, vocab: 4096, ctx: 4096, type: 'q8_0',
  };
}

/** bytes of weights a decoded token reads: every block's non-expert tensors, k of n experts, one embedding row, the head */
function decodeBytes(header: GgufHeader, cfg: ModelConfig): number {
  const moe = cfg.moe!;
  let bytes = 0;
  for (const t of header.tensors) {
    if (t.name === 'token_embd.weight') bytes += t.byteLength / cfg.nVocab + (cfg.tiedEmbeddings ? t.byteLength : 0);
    else if (isExpertTensor(t.name) && t.shape.length === 3) bytes += (t.byteLength * moe.nExpertUsed) / moe.nExpert;
    else bytes += t.byteLength;
  }
  return bytes;
}

interface Speed {
  prompt_tok_s: number;
  decode_tok_s: number;
}

async function timeStage(be: StageBackend, prompt: number[], n: number, id: string): Promise<Speed> {
  await be.openSession(id, { contextLength: prompt.length + n });
  let t0 = performance.now();
  let out = (await be.forward(id, { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0)).output;
  const promptMs = performance.now() - t0;
  t0 = performance.now();
  for (let i = 0; i < n - 1; i++) {
    const next = argmax(out.kind === 'logits' ? out.logits : new Float32Array(1));
    out = (await be.forward(id, { kind: 'tokens', tokens: Int32Array.of(next) }, prompt.length + i)).output;
  }
  const decodeMs = performance.now() - t0;
  await be.releaseSession(id);
  return { prompt_tok_s: round((prompt.length * 1000) / promptMs), decode_tok_s: round(((n - 1) * 1000) / decodeMs) };
}

/** Qwen3.5-35B-A3B: 40 blocks, 10 attend (2 KV heads of 256), 30 DeltaNet (16 q/k, 32 v heads of 128, conv 4) */
const REAL: LinearAttentionConfig = { convKernel: 4, headDim: 128, nKHeads: 16, nVHeads: 32, convChannels: 2 * 16 * 128 + 32 * 128 };

function stateAtRealShapes(): Record<string, number> {
  const auditKvPerToken = 10 * 2 * 256 * 2 * 2; // f16 K and V
  const auditState = 30 * ((REAL.convKernel - 1) * REAL.convChannels + REAL.nVHeads * REAL.headDim * REAL.headDim) * 4;
  const cpuKvPerToken = 10 * 2 * 256 * 2 * 4; // the CPU reference keeps f32 K and V
  const cpuState = 30 * deltaLayerBytes(REAL);
  return {
    audit_kv_bytes_per_token: auditKvPerToken,
    audit_state_bytes: auditState,
    cpu_kv_bytes_per_token: cpuKvPerToken,
    cpu_state_bytes: cpuState,
    cpu_state_bytes_with_checkpoints: 2 * cpuState,
    cpu_state_ratio_to_audit: round(cpuState / auditState),
    // the WebGPU stage keeps the chunk's decays in f32
    webgpu_state_bytes: 30 * gpuDeltaLayerBytes(REAL),
  };
}

export async function run(args: string[]): Promise<unknown> {
  const { values } = parseArgs({ args, options: { threads: { type: 'string', default: '1' }, webgpu: { type: 'boolean', default: false }, layers: { type: 'string', default: '8' }, prompt: { type: 'string', default: '64' }, decode: { type: 'string', default: '16' } } });
  const threads = Number(values.threads);
  const path = await syntheticModel(benchModel(Number(values.layers)));
  const source = await openTensorSource(path);
  const cfg = configFromHeader(source.header);
  const prompt = Array.from({ length: Number(values.prompt) }, (_, i) => 300 + ((i * 37) % 3000));
  const n = Number(values.decode);

  const llama = await LlamaModelFfi.load(path);
  const be = new CpuBackend();
  await be.load(source, { start: 0, end: cfg.nLayer });
  timeBare(llama, prompt.slice(0, 4), 2, threads);
  await timeStage(be, prompt.slice(0, 4), 2, 'warm');
  let cpu: Speed = { prompt_tok_s: 0, decode_tok_s: 0 };
  let ref: Speed = { prompt_tok_s: 0, decode_tok_s: 0 };
  const best = (a: Speed, b: Speed): Speed => ({ prompt_tok_s: Math.max(a.prompt_tok_s, b.prompt_tok_s), decode_tok_s: Math.max(a.decode_tok_s, b.decode_tok_s) });
  for (let i = 0; i < REPEATS; i++) {
    ref = best(ref, timeBare(llama, prompt, n, threads));
    cpu = best(cpu, await timeStage(be, prompt, n, `run${i}`));
  }
  let webgpu: Record<string, unknown> | undefined;
  if (values.webgpu) {
    const gpu = await createNodeWebGpuBackend();
    await gpu.load(source, { start: 0, end: cfg.nLayer });
    await timeStage(gpu, prompt.slice(0, 4), 2, 'warm');
    const s = await timeStage(gpu, prompt, n, 'gpu');
    webgpu = { adapter: `${gpu.adapter.vendor} ${gpu.adapter.architecture} ${gpu.adapter.description}`.trim(), software: gpu.adapter.isFallbackAdapter, ...s, ratio_to_llamacpp: { prompt: Number((s.prompt_tok_s / ref.prompt_tok_s).toPrecision(2)), decode: Number((s.decode_tok_s / ref.decode_tok_s).toPrecision(2)) } };
    await gpu.dispose();
  }
  // the state one session holds on this model after the run's prompt and decode
  await be.openSession('mem', { contextLength: prompt.length + n });
  await be.forward('mem', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0);
  const stats = be.sessionStats('mem');
  const bytes = decodeBytes(source.header, cfg);
  llama.dispose();
  await be.dispose();
  await source.close();
  return {
    model: `synthetic qwen35moe ${cfg.nLayer} blocks × n_embd ${cfg.nEmbd}, Q8_0 (${path.split('/').pop()})`,
    threads,
    prompt_tokens: prompt.length,
    decode_tokens: n,
    decode_weight_bytes_per_token: Math.round(bytes),
    llamacpp: { ...ref, decode_GB_s: round((bytes * ref.decode_tok_s) / 1e9) },
    cpu_backend: { ...cpu, decode_GB_s: round((bytes * cpu.decode_tok_s) / 1e9), ratio_to_llamacpp: { prompt: round(cpu.prompt_tok_s / ref.prompt_tok_s), decode: round(cpu.decode_tok_s / ref.decode_tok_s) } },
    ...(webgpu ? { webgpu_backend: webgpu } : {}),
    session_memory_this_model: { kv_bytes: stats.kvBytes, recurrent_bytes: stats.recurrentBytes ?? 0 },
    session_memory_real_shapes: stateAtRealShapes(),
  };
}
