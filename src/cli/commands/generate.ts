// `gguf-mesh generate`: continue a prompt with a local model, on the CPU reference engine
// (optionally as a chain of in-process stages, --layers) or on llama.cpp. Text streams to
// stdout; --json prints one document with tokens, text and timings instead.
//
// Where the generator comes from is decided in `openGenerator`: a new route (e.g. joining a
// room) is one more branch there.

import type { Command, ParsedArgs } from '../command.ts';
import { UsageError, choiceOption, intOption, numberOption, optionalIntOption, stringOption } from '../command.ts';
import { createNodeCpuBackend } from '../../backends/cpu/node-threads.ts';
import type { WeightStorage } from '../../backends/cpu/weights.ts';
import type { KvType } from '../../backends/llamacpp/ffi.ts';
import { LlamaCppModel } from '../../backends/llamacpp/generator.ts';
import { parseLayerRanges } from '../../backends/shard.ts';
import type { StageBackend } from '../../backends/types.ts';
import { MeshError } from '../../errors.ts';
import { isUrl } from '../../gguf/parse.ts';
import { openTensorSource } from '../../gguf/source.ts';
import type { TensorSource } from '../../gguf/types.ts';
import { configFromHeader } from '../../model/config.ts';
import type { SamplerOptions } from '../../model/sampler.ts';
import { Tokenizer } from '../../model/tokenizer/tokenizer.ts';
import { ChainGenerator, InProcessChain } from '../../route/generation.ts';
import { StepperGenerator } from '../../route/generation-loop.ts';
import type { GenerationResult, TextGenerator } from '../../model/generation-output.ts';
import { joinRoom, timingTable } from '../../route/remote.ts';
import { generateOnRoute } from '../../route/route-generation.ts';
import { trustRoomServer } from '../../transport/tls-trust.ts';
import type { HopTelemetry, TelemetryEvent } from '../../route/telemetry.ts';

const BACKENDS = ['cpu', 'llamacpp', 'webgpu'] as const;
type Backend = (typeof BACKENDS)[number];

export const command: Command = {
  name: 'generate',
  summary: 'continue a prompt with a local GGUF model (CPU reference engine or llama.cpp)',
  usage: '(--model <path|url> | --join <room url> [--secret S]) --prompt <text> [options]',
  options: {
    model: { type: 'string', short: 'm', valueName: '<path|url>', description: 'GGUF model file or http(s) URL' },
    prompt: { type: 'string', short: 'p', valueName: '<text>', description: 'prompt text (BOS added when the model asks, special tokens parsed)' },
    n: { type: 'string', valueName: '<count>', description: 'most tokens to generate', default: '64' },
    backend: { type: 'string', valueName: '<cpu|llamacpp|webgpu>', description: 'engine (webgpu: Dawn in this process, SwiftShader where there is no GPU)', default: 'cpu' },
    layers: { type: 'string', valueName: '<a-b,b-c,…>', description: 'run as a chain of in-process stages over these layer ranges (llamacpp: each a shard GGUF)' },
    temperature: { type: 'string', valueName: '<t>', description: 'sampling temperature; 0 is greedy', default: '0' },
    'top-k': { type: 'string', valueName: '<k>', description: 'keep the k most likely tokens (0 = off)', default: '0' },
    'top-p': { type: 'string', valueName: '<p>', description: 'nucleus sampling threshold (1 = off)', default: '1' },
    'min-p': { type: 'string', valueName: '<p>', description: 'drop tokens below p × the top probability (0 = off)', default: '0' },
    'repeat-penalty': { type: 'string', valueName: '<x>', description: 'penalty for recently seen tokens (1 = off)', default: '1' },
    seed: { type: 'string', valueName: '<n>', description: 'sampling seed' },
    stop: { type: 'string', valueName: '<text>', description: 'stop when the text contains this (repeatable)', multiple: true },
    ctx: { type: 'string', valueName: '<n>', description: 'context length (default: prompt + n)' },
    threads: { type: 'string', valueName: '<n>', description: 'CPU threads (llamacpp default: all cores but one; cpu: every core)' },
    'pin-threads': { type: 'boolean', description: 'cpu (Linux): each engine thread on a CPU of its own (as node --pin-threads)' },
    'flash-attn': { type: 'boolean', description: 'llamacpp: flash attention (default off)' },
    'kv-type': { type: 'string', valueName: '<f32|f16|q8_0|q4_0>', description: 'llamacpp: KV cache type', default: 'f32' },
    'weight-storage': { type: 'string', valueName: '<auto|f32|quantized>', description: 'cpu: auto = Q8_0/Q4_0 as int8 and the rest f32; f32; or as stored (smallest, slowest)', default: 'auto' },
    json: { type: 'boolean', description: 'print one JSON document: prompt_tokens, tokens, text, timings' },
    join: { type: 'string', valueName: '<room url>', description: 'generate over the route of a room instead of a local model (see `serve`)' },
    secret: { type: 'string', valueName: '<secret>', description: '--join: the room secret (default: the URL\'s #secret=)' },
    wait: { type: 'string', valueName: '<s>', description: '--join: wait this long for the route to be ready', default: '30' },
    'ca-fingerprint': { type: 'string', description: "an https room server's local CA: its sha256 fingerprint (default: the link's #ca=)", valueName: '<sha256>' },
    'ca-file': { type: 'string', description: "an https room server's CA certificate (PEM), trusted beside the system's", valueName: '<file>' },
    telemetry: { type: 'boolean', description: '--join: print a per-stage timing table at the end (stderr)' },
  },
  async run(args: ParsedArgs): Promise<number> {
    const opts = readOptions(args);
    const joinUrl = stringOption(args, 'join');
    if (joinUrl) await trustRoomServer(joinUrl, { fingerprint: stringOption(args, 'ca-fingerprint'), caFile: stringOption(args, 'ca-file') });
    // a session whose server went away goes on once the room is back (resuming-link.ts): say so on stderr
    const onEvent = (e: TelemetryEvent): void => void (e.type === 'session_resumed' && process.stderr.write(`session resumed at position ${e.position} on route ${e.routeId} after ${e.resumeMs} ms\n`));
    const joined = joinUrl ? await joinRoom(joinUrl, stringOption(args, 'secret'), intOption(args, 'wait', 30) * 1000, { onEvent }) : null;
    const source = joined ? null : await openTensorSource(opts.model);
    let generator: TextGenerator | null = null;
    try {
      const tokenizer = Tokenizer.fromMetadata((joined ? await joined.header() : source!.header).metadata);
      const promptTokens = tokenizer.encode(opts.prompt);
      const contextLength = opts.ctx ?? promptTokens.length + opts.n;
      const request = {
        promptTokens,
        maxTokens: opts.n,
        sampler: opts.sampler,
        stopStrings: opts.stop,
        contextLength,
        ...(opts.json ? {} : { onDelta: (d: string) => process.stdout.write(d) }),
      };
      if (joined) {
        // the route's last stage samples (with this seed and these settings), so each token takes
        // the one-way path — N + 1 hops, no logits climbing back through every stage
        const result = await generateOnRoute(joined.link, joined.routeId, tokenizer, request);
        printResult(result, opts.json, result.info?.hops);
        if (result.info && args.values.telemetry) process.stderr.write(`${timingTable(result.info)}\n`);
        return 0;
      }
      generator = await openGenerator(opts, source!, tokenizer, contextLength);
      printResult(await generator.generate(request), opts.json);
      return 0;
    } finally {
      await generator?.dispose();
      if (!generator) await joined?.close();
      await source?.close();
    }
  },
};

interface GenerateOptions {
  model: string;
  prompt: string;
  n: number;
  backend: Backend;
  layers: string | undefined;
  sampler: SamplerOptions;
  stop: string[];
  ctx: number | undefined;
  threads: number | undefined;
  pinThreads: boolean;
  flashAttention: boolean;
  kvType: KvType;
  weightStorage: WeightStorage;
  json: boolean;
}

function readOptions(args: ParsedArgs): GenerateOptions {
  const backend = choiceOption(args, 'backend', BACKENDS) ?? 'cpu';
  const kvType = stringOption(args, 'kv-type') ?? 'f32';
  if (!['f32', 'f16', 'q8_0', 'q4_0'].includes(kvType)) throw new UsageError(`--kv-type must be f32, f16, q8_0 or q4_0, got '${kvType}'`);
  const weightStorage = stringOption(args, 'weight-storage') ?? 'auto';
  if (weightStorage !== 'auto' && weightStorage !== 'f32' && weightStorage !== 'quantized') {
    throw new UsageError(`--weight-storage must be auto, f32 or quantized, got '${weightStorage}'`);
  }
  const n = intOption(args, 'n', 64);
  if (n < 0) throw new UsageError(`--n must be >= 0, got ${n}`);
  const temperature = numberOption(args, 'temperature', 0);
  if (temperature < 0) throw new UsageError(`--temperature must be >= 0, got ${temperature}`);
  const seed = optionalIntOption(args, 'seed');
  const ctx = optionalIntOption(args, 'ctx');
  if (ctx !== undefined && ctx <= 0) throw new UsageError(`--ctx must be > 0, got ${ctx}`);
  const threads = optionalIntOption(args, 'threads');
  const layers = stringOption(args, 'layers');
  const stop = (args.values.stop as string[] | undefined) ?? [];
  return {
    model: args.values.join !== undefined ? '' : stringOption(args, 'model', true),
    prompt: stringOption(args, 'prompt', true),
    n,
    backend,
    layers,
    sampler: {
      temperature,
      topK: intOption(args, 'top-k', 0),
      topP: numberOption(args, 'top-p', 1),
      minP: numberOption(args, 'min-p', 0),
      repeatPenalty: numberOption(args, 'repeat-penalty', 1),
      ...(seed !== undefined ? { seed } : {}),
    },
    stop,
    ctx,
    threads,
    pinThreads: args.values['pin-threads'] === true,
    flashAttention: args.values['flash-attn'] === true,
    kvType: kvType as KvType,
    weightStorage,
    json: args.values.json === true,
  };
}

/** The generator the options ask for. */
async function openGenerator(opts: GenerateOptions, source: TensorSource, tokenizer: Tokenizer, contextLength: number): Promise<TextGenerator> {
  if (opts.backend === 'llamacpp' && !opts.layers) {
    if (isUrl(opts.model)) throw new MeshError('LLAMACPP_LOCAL_ONLY', `llama.cpp loads local files only, not ${opts.model}`);
    const model = await LlamaCppModel.load(opts.model, {
      contextLength,
      flashAttention: opts.flashAttention,
      kvType: opts.kvType,
      ...(opts.threads ? { threads: opts.threads } : {}),
    });
    return new StepperGenerator(model, tokenizer);
  }
  const { nLayer } = configFromHeader(source.header);
  const shards = opts.layers ? parseLayerRanges(opts.layers, nLayer) : [{ start: 0, end: nLayer }];
  const stages: StageBackend[] = [];
  for (const shard of shards) {
    // webgpu and llama.cpp: loaded lazily, so other backends never start Dawn or libllama
    const stage =
      opts.backend === 'webgpu'
        ? await (await import('../../backends/webgpu/node.ts')).createNodeWebGpuBackend()
        : opts.backend === 'llamacpp'
          ? new (await import('../../backends/llamacpp/range-stage.ts')).LlamaCppRangeStage({ flashAttention: opts.flashAttention, kvType: opts.kvType, ...(opts.threads ? { threads: opts.threads } : {}) })
          : createNodeCpuBackend({ weightStorage: opts.weightStorage, pinThreads: opts.pinThreads, ...(opts.threads ? { threads: opts.threads } : {}) });
    await stage.load(source, shard);
    stages.push(stage);
  }
  return new ChainGenerator(new InProcessChain(stages), tokenizer);
}

function printResult(result: GenerationResult, json: boolean, hops?: HopTelemetry[]): void {
  if (json) {
    process.stdout.write(
      JSON.stringify({
        prompt_tokens: result.promptTokens,
        tokens: result.tokens,
        text: result.text,
        timings: result.timings,
        // --join: each hop of the route with its carrier, candidate pair, bytes and wire time
        ...(hops ? { hops } : {}),
      }) + '\n',
    );
    return;
  }
  const t = result.timings;
  process.stdout.write('\n');
  process.stderr.write(
    `prompt: ${result.promptTokens.length} tokens in ${t.prompt_ms.toFixed(1)} ms (${t.prompt_tok_s.toFixed(1)} tok/s); ` +
      `generated ${result.tokens.length} tokens, decode ${t.decode_ms.toFixed(1)} ms (${t.decode_tok_s.toFixed(1)} tok/s); stop: ${result.stopReason}\n`,
  );
}
