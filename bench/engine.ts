// `npm run bench -- engine [--threads 1,2] [--only stories|synthetic|matvec] [--rounds 5] [--f32]`:
// prompt and decode tok/s of the CPU reference engine and both llama.cpp backends — the
// node-llama-cpp generator (generate --backend llamacpp) and the FFI stage a route node serves
// (LlamaCppStage) — each with its ratio to bare llama.cpp (libllama through FFI, same threads)
// measured in the same run, rounds interleaved, best of each kept. Models: stories260K, and a
// synthetic ~250M-parameter Q8_0 model (1024 embd, 16 layers, made once into .cache/models).
// Then each stage's resident memory against its shard and KV bytes, in a process of its own,
// and the CPU engine's mat-vec GB/s per weight type (./cpu-matvec.ts).
// Goals (250M model, the most threads asked for): CPU engine decode ≥ 0.6× and prefill ≥ 0.5×
// bare llama.cpp, both llama.cpp backends ≥ 0.95×, CPU stage memory ≤ 1.15× shard + KV.
import { execFileSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import { cpuMatvecFigures } from './cpu-matvec.ts';
import { LlamaModelFfi } from '../src/backends/llamacpp/ffi.ts';
import type { LlamaContextFfi } from '../src/backends/llamacpp/ffi.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { configFromHeader } from '../src/model/config.ts';
import { argmax } from '../src/model/sampler.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { ChainGenerator, InProcessChain } from '../src/route/generation.ts';
import { StepperGenerator } from '../src/route/generation-loop.ts';
import type { GenerationTimings, TextGenerator } from '../src/model/generation-output.ts';
import { stories260K } from '../test/support/models.ts';
import { syntheticModel } from '../test/support/synthetic.ts';
import { finishLoad, goal, machineLoad, round2 } from './lib/goals.ts';
import type { Goal } from './lib/goals.ts';

interface Speed {
  prompt_tok_s: number;
  decode_tok_s: number;
}

interface ModelCase {
  name: string;
  path: string;
  promptTokens: number;
  decodeTokens: number;
  /** the case the goals are checked on */
  goals?: boolean;
}

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
  return { prompt_tok_s: round2(t.prompt_tok_s), decode_tok_s: round2(t.decode_tok_s) };
}

/**
 * bare llama.cpp: one batched decode of the prompt, then one token at a time (greedy), on one
 * context per model and thread count, cleared between rounds (a fresh context's first decode
 * also allocates its buffers, which the backends pay at session open, outside the timing)
 */
export function timeBare(ctx: LlamaContextFfi, prompt: number[], n: number): Speed {
  ctx.clear();
  let t0 = performance.now();
  let logits = ctx.decode(prompt);
  const promptMs = performance.now() - t0;
  t0 = performance.now();
  for (let i = 0; i < n - 1; i++) logits = ctx.decode([argmax(logits)]);
  const decodeMs = performance.now() - t0;
  return { prompt_tok_s: round2((prompt.length * 1000) / promptMs), decode_tok_s: round2(((n - 1) * 1000) / decodeMs) };
}

type Contender = { name: string; time: () => Promise<Speed>; dispose: () => Promise<void>; extra?: Record<string, unknown> };

async function stageGenerator(name: string, stage: StageBackend, path: string, nLayer: number, tokenizer: Tokenizer, prompt: number[], n: number): Promise<Contender> {
  const source = await openTensorSource(path);
  const t0 = performance.now();
  await stage.load(source, { start: 0, end: nLayer });
  const loadMs = performance.now() - t0;
  const gen = new ChainGenerator(new InProcessChain([stage]), tokenizer);
  const extra = 'weightBytes' in stage ? { load_ms: Math.round(loadMs), weight_bytes: (stage as { weightBytes: number }).weightBytes } : {};
  return { name, time: () => timeGenerator(gen, prompt, n), dispose: async () => (await gen.dispose(), await source.close()), extra };
}

async function benchModel(c: ModelCase, threads: number, rounds: number, f32: boolean): Promise<Record<string, unknown>> {
  const source = await openTensorSource(c.path);
  const cfg = configFromHeader(source.header);
  const tokenizer = Tokenizer.fromMetadata(source.header.metadata);
  await source.close();
  const prompt = promptOf(tokenizer, c.promptTokens);
  const n = c.decodeTokens;

  const bareModel = await LlamaModelFfi.load(c.path);
  const bareCtx = bareModel.createContext({ contextLength: prompt.length + n + 1, threads, flashAttention: false, kvType: 'f32' });
  const llama = new StepperGenerator(await LlamaCppModel.load(c.path, { threads, contextLength: prompt.length + n }), tokenizer);
  const contenders: Contender[] = [
    { name: 'llamacpp_backend', time: () => timeGenerator(llama, prompt, n), dispose: () => llama.dispose() },
    await stageGenerator('llamacpp_stage', new LlamaCppStage({ threads, kvType: 'f32', flashAttention: false }), c.path, cfg.nLayer, tokenizer, prompt, n),
    await stageGenerator('cpu_backend', createNodeCpuBackend({ threads }), c.path, cfg.nLayer, tokenizer, prompt, n),
  ];
  // the same engine with every matrix dequantised to f32 (differs from 'auto' for Q8_0/Q4_0)
  if (f32) contenders.push(await stageGenerator('cpu_backend_f32_weights', createNodeCpuBackend({ threads, weightStorage: 'f32' }), c.path, cfg.nLayer, tokenizer, prompt, n));

  // warm-up, then rounds that take turns, so a busy machine slows every contender alike
  timeBare(bareCtx, prompt, 2);
  for (const k of contenders) await k.time();
  let bare = ZERO;
  const best = new Map<string, Speed>(contenders.map((k) => [k.name, ZERO]));
  for (let i = 0; i < rounds; i++) {
    bare = faster(bare, timeBare(bareCtx, prompt, n));
    for (const k of contenders) best.set(k.name, faster(best.get(k.name)!, await k.time()));
  }
  bareCtx.dispose();
  bareModel.dispose();
  for (const k of contenders) await k.dispose();

  const ratio = (s: Speed) => ({ prompt: round2(s.prompt_tok_s / bare.prompt_tok_s), decode: round2(s.decode_tok_s / bare.decode_tok_s) });
  return {
    model: c.name,
    threads,
    parameters: cfg.nLayer * (2 * cfg.nEmbd * cfg.nHead * cfg.headDim + 2 * cfg.nEmbd * cfg.nHeadKv * cfg.headDim + 3 * cfg.nEmbd * cfg.nFf) + (cfg.tiedEmbeddings ? 1 : 2) * cfg.nVocab * cfg.nEmbd,
    prompt_tokens: prompt.length,
    decode_tokens: n,
    llamacpp_bare: bare,
    ...Object.fromEntries(contenders.map((k) => [k.name, { ...best.get(k.name)!, ratio_to_bare: ratio(best.get(k.name)!), ...k.extra }])),
  };
}

/**
 * a stage's resident memory, measured in a process of its own (bench/lib/stage-memory.ts), the
 * lower of two runs (when freed load buffers go back to the system varies by a few percent)
 */
function stageMemory(path: string, kind: 'cpu' | 'llamacpp', threads: number, context: number): Record<string, unknown> {
  const script = join(process.cwd(), 'bench', 'lib', 'stage-memory.ts');
  const runs = [0, 1].map(() => {
    const out = execFileSync(process.execPath, ['--expose-gc', join(process.cwd(), 'bin', 'run-ts.js'), script, path, kind, String(threads), String(context)], { encoding: 'utf8' });
    const m = JSON.parse(out.trim().split('\n').at(-1)!) as Record<string, number>;
    const need = m.shard_bytes! + m.kv_bytes!;
    return { ...m, ratio_rss: round2(m.rss_loaded! / need), ratio_above_runtime: round2((m.rss_loaded! - m.rss_before_load!) / need) };
  });
  const low = runs.reduce((a, b) => (b.ratio_above_runtime < a.ratio_above_runtime ? b : a));
  return { ...low, ratio_above_runtime_runs: runs.map((r) => r.ratio_above_runtime) };
}

export async function run(args: string[]): Promise<unknown> {
  const { values } = parseArgs({
    args,
    options: {
      threads: { type: 'string', default: `1,${availableParallelism()}` },
      only: { type: 'string' },
      rounds: { type: 'string', default: '5' },
      f32: { type: 'boolean', default: false },
    },
  });
  const threadCounts = [...new Set(values.threads.split(',').map(Number))];
  const load = machineLoad();
  const cases: ModelCase[] = [];
  if (values.only !== 'synthetic' && values.only !== 'matvec') {
    cases.push({ name: 'stories260K (F32)', path: await stories260K(), promptTokens: 128, decodeTokens: 128 });
  }
  if (values.only !== 'stories' && values.only !== 'matvec') {
    const path = await syntheticModel({ arch: 'llama', type: 'q8_0', layers: 16, embd: 1024, heads: 16, kvHeads: 4, ffn: 2816, vocab: 32000 });
    cases.push({ name: 'synthetic llama Q8_0 1024×16 (~250M)', path, promptTokens: 128, decodeTokens: 32, goals: true });
  }
  const results: Record<string, unknown>[] = [];
  for (const c of cases) for (const t of threadCounts) results.push(await benchModel(c, t, Number(values.rounds), values.f32));

  const goals: Goal[] = [];
  let memory: Record<string, unknown> | null = null;
  const main = cases.find((c) => c.goals);
  if (main) {
    const top = Math.max(...threadCounts);
    const r = results.find((x) => x.model === main.name && x.threads === top)! as Record<string, { ratio_to_bare: { prompt: number; decode: number } }>;
    goals.push(goal(`cpu decode / bare llama.cpp (${top} threads)`, r.cpu_backend!.ratio_to_bare.decode, 'min', 0.6));
    goals.push(goal(`cpu prefill / bare llama.cpp (${top} threads)`, r.cpu_backend!.ratio_to_bare.prompt, 'min', 0.5));
    for (const k of ['llamacpp_backend', 'llamacpp_stage']) {
      goals.push(goal(`${k} decode / bare llama.cpp (${top} threads)`, r[k]!.ratio_to_bare.decode, 'min', 0.95));
      goals.push(goal(`${k} prefill / bare llama.cpp (${top} threads)`, r[k]!.ratio_to_bare.prompt, 'min', 0.95));
    }
    const context = 512;
    memory = { context, cpu: stageMemory(main.path, 'cpu', top, context), llamacpp: stageMemory(main.path, 'llamacpp', top, context) };
    const cpuMem = memory.cpu as { ratio_above_runtime: number };
    goals.push(goal('cpu stage resident memory above the idle runtime / (shard + KV bytes)', cpuMem.ratio_above_runtime, 'max', 1.15));
  }
  const matvec = values.only === undefined || values.only === 'matvec' ? cpuMatvecFigures(1024, 1024, 5) : [];
  return {
    note: 'tok/s, best of interleaved rounds; ratio_to_bare = backend / bare llama.cpp (libllama via FFI, flash attention off, F32 KV) measured in the same run with the same threads. The CPU engine runs its kernels in WebAssembly SIMD on `threads` threads (worker threads over a shared memory). Memory: RSS of a process holding one whole-model stage with a session of `context` positions, after garbage collection; ratio_above_runtime leaves out what the idle Node runtime holds before loading.',
    machine: finishLoad(load),
    matvec: { shape: '[1024×1024]·[1024]', figures: matvec },
    results,
    memory,
    goals,
  };
}
