// `npm run bench -- engine [--threads N] [--only stories|synthetic|matvec]`: prompt and decode tok/s
// of the CPU reference engine and the llama.cpp backend (node-llama-cpp), each with its ratio
// to bare llama.cpp (libllama through FFI, same threads) measured in the same run, on
// stories260K and on a synthetic ~250M-parameter Q8_0 model (1024 embd, 16 layers), which is
// made once into .cache/models; and the CPU engine's mat-vec GB/s per weight type (./cpu-matvec.ts).
import { parseArgs } from 'node:util';
import { cpuMatvecFigures } from './cpu-matvec.ts';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { LlamaModelFfi } from '../src/backends/llamacpp/ffi.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { configFromHeader } from '../src/model/config.ts';
import { argmax } from '../src/model/sampler.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { ChainGenerator, InProcessChain } from '../src/route/generation.ts';
import { StepperGenerator } from '../src/route/generation-loop.ts';
import type { GenerationTimings, TextGenerator } from '../src/model/generation-output.ts';
import { stories260K } from '../test/support/models.ts';
import { syntheticModel } from '../test/support/synthetic.ts';

interface Speed {
  prompt_tok_s: number;
  decode_tok_s: number;
}

interface ModelCase {
  name: string;
  path: string;
  promptTokens: number;
  decodeTokens: number;
  /** has Q8_0/Q4_0 weights, which the CPU engine keeps as int8 by default */
  quantized?: boolean;
}

const round = (x: number) => Math.round(x * 100) / 100;

/** rounds per measurement; the best of each is kept (the machine may be shared) */
const REPEATS = 3;

const ZERO: Speed = { prompt_tok_s: 0, decode_tok_s: 0 };

function faster(a: Speed, b: Speed): Speed {
  return { prompt_tok_s: Math.max(a.prompt_tok_s, b.prompt_tok_s), decode_tok_s: Math.max(a.decode_tok_s, b.decode_tok_s) };
}

/** a prompt of exactly n tokens: BOS (when the model has one) then ids cycling through the vocabulary */
function promptOf(tokenizer: Tokenizer, n: number): number[] {
  const out: number[] = tokenizer.bos !== undefined ? [tokenizer.bos] : [];
  for (let i = 0; out.length < n; i++) {
    const id = 300 + ((i * 37) % Math.max(1, tokenizer.size - 400));
    if (!tokenizer.isEog(id)) out.push(id);
  }
  return out;
}

async function timeGenerator(gen: TextGenerator, prompt: number[], n: number): Promise<Speed> {
  const r = await gen.generate({ promptTokens: prompt, maxTokens: n, contextLength: prompt.length + n, ignoreEog: true });
  if (r.tokens.length !== n) throw new Error(`generated ${r.tokens.length} of ${n} tokens (${r.stopReason})`);
  return speedOf(r.timings);
}

function speedOf(t: GenerationTimings): Speed {
  return { prompt_tok_s: round(t.prompt_tok_s), decode_tok_s: round(t.decode_tok_s) };
}

/** bare llama.cpp: one batched decode of the prompt, then one token at a time (greedy) */
export function timeBare(model: LlamaModelFfi, prompt: number[], n: number, threads: number): Speed {
  const ctx = model.createContext({ contextLength: prompt.length + n + 1, threads, flashAttention: false, kvType: 'f32' });
  try {
    let t0 = performance.now();
    let logits = ctx.decode(prompt);
    const promptMs = performance.now() - t0;
    t0 = performance.now();
    for (let i = 0; i < n - 1; i++) logits = ctx.decode([argmax(logits)]);
    const decodeMs = performance.now() - t0;
    return { prompt_tok_s: round((prompt.length * 1000) / promptMs), decode_tok_s: round(((n - 1) * 1000) / decodeMs) };
  } finally {
    ctx.dispose();
  }
}

async function benchModel(c: ModelCase, threads: number): Promise<Record<string, unknown>> {
  const source = await openTensorSource(c.path);
  const cfg = configFromHeader(source.header);
  const tokenizer = Tokenizer.fromMetadata(source.header.metadata);
  const prompt = promptOf(tokenizer, c.promptTokens);

  const bareModel = await LlamaModelFfi.load(c.path);
  const llama = new StepperGenerator(await LlamaCppModel.load(c.path, { threads, contextLength: prompt.length + c.decodeTokens }), tokenizer);
  const loadStart = performance.now();
  const stage = new CpuBackend();
  await stage.load(source, { start: 0, end: cfg.nLayer });
  const loadMs = performance.now() - loadStart;
  const cpuBytes = stage.weightBytes;
  const cpuGen = new ChainGenerator(new InProcessChain([stage]), tokenizer);
  // the same engine with every matrix dequantised to f32 (differs from 'auto' for Q8_0/Q4_0)
  const f32Stage = c.quantized ? new CpuBackend({ weightStorage: 'f32' }) : null;
  await f32Stage?.load(source, { start: 0, end: cfg.nLayer });
  const f32Bytes = f32Stage?.weightBytes ?? 0;
  const f32Gen = f32Stage ? new ChainGenerator(new InProcessChain([f32Stage]), tokenizer) : null;

  // warm-up, then rounds that take turns, so a busy machine slows all three alike
  timeBare(bareModel, prompt.slice(0, 4), 2, threads);
  await timeGenerator(llama, prompt.slice(0, 4), 2);
  await timeGenerator(cpuGen, prompt.slice(0, 4), 2);
  if (f32Gen) await timeGenerator(f32Gen, prompt.slice(0, 4), 2);
  let bare = ZERO;
  let llamacpp = ZERO;
  let cpu = ZERO;
  let cpuF32 = ZERO;
  for (let i = 0; i < REPEATS; i++) {
    bare = faster(bare, timeBare(bareModel, prompt, c.decodeTokens, threads));
    llamacpp = faster(llamacpp, await timeGenerator(llama, prompt, c.decodeTokens));
    cpu = faster(cpu, await timeGenerator(cpuGen, prompt, c.decodeTokens));
    if (f32Gen) cpuF32 = faster(cpuF32, await timeGenerator(f32Gen, prompt, c.decodeTokens));
  }
  bareModel.dispose();
  await llama.dispose();
  await cpuGen.dispose();
  await f32Gen?.dispose();
  await source.close();

  const ratio = (s: Speed) => ({
    prompt: round(s.prompt_tok_s / bare.prompt_tok_s),
    decode: round(s.decode_tok_s / bare.decode_tok_s),
  });
  return {
    model: c.name,
    parameters: cfg.nLayer * (2 * cfg.nEmbd * cfg.nHead * cfg.headDim + 2 * cfg.nEmbd * cfg.nHeadKv * cfg.headDim + 3 * cfg.nEmbd * cfg.nFf) + (cfg.tiedEmbeddings ? 1 : 2) * cfg.nVocab * cfg.nEmbd,
    prompt_tokens: prompt.length,
    decode_tokens: c.decodeTokens,
    llamacpp_bare: bare,
    llamacpp_backend: { ...llamacpp, ratio_to_bare: ratio(llamacpp) },
    cpu_backend: { ...cpu, ratio_to_bare: ratio(cpu), load_ms: Math.round(loadMs), weight_bytes: cpuBytes },
    ...(f32Stage ? { cpu_backend_f32_weights: { ...cpuF32, ratio_to_bare: ratio(cpuF32), weight_bytes: f32Bytes } } : {}),
  };
}

export async function run(args: string[]): Promise<unknown> {
  const { values } = parseArgs({
    args,
    options: {
      threads: { type: 'string', default: '1' },
      only: { type: 'string' },
    },
  });
  const threads = Number(values.threads);
  const cases: ModelCase[] = [];
  if (values.only !== 'synthetic' && values.only !== 'matvec') {
    cases.push({ name: 'stories260K (F32)', path: await stories260K(), promptTokens: 128, decodeTokens: 128 });
  }
  if (values.only !== 'stories' && values.only !== 'matvec') {
    const path = await syntheticModel({ arch: 'llama', type: 'q8_0', layers: 16, embd: 1024, heads: 16, kvHeads: 4, ffn: 2816, vocab: 32000 });
    cases.push({ name: 'synthetic llama Q8_0 1024×16 (~250M)', path, promptTokens: 128, decodeTokens: 32, quantized: true });
  }
  const results = [];
  if (values.only !== 'matvec') for (const c of cases) results.push(await benchModel(c, threads));
  const matvec = values.only === undefined || values.only === 'matvec' ? cpuMatvecFigures(1024, 1024, 5) : [];
  return {
    matvec: { shape: '[1024×1024]·[1024]', figures: matvec },
    note: 'tok/s, best of 3 interleaved rounds; ratio_to_bare = backend / bare llama.cpp (libllama via FFI, flash attention off, F32 KV) measured in the same run with the same threads; the CPU engine is single-threaded (JS + WebAssembly SIMD matmul)',
    threads,
    results,
  };
}
