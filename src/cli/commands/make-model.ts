// `gguf-mesh make-model`: writes a random-weight GGUF of any shape and quant type with a real
// tokenizer (see src/model/synthetic-model.ts), streamed so large benchmark models fit.

import type { Command } from '../command.ts';
import { choiceOption, intOption, numberOption, optionalIntOption, stringOption } from '../command.ts';
import type { BpePre, TokenizerKind } from '../../model/synthetic-vocab.ts';
import { BPE_PRES } from '../../model/synthetic-vocab.ts';
import type { MakeModelOptions, ModelType, RopeScaling, SyntheticArch } from '../../model/synthetic-model.ts';
import { ARCHS, MODEL_DEFAULTS, MODEL_TYPES, ROPE_SCALINGS, makeModelFile } from '../../model/synthetic-model.ts';

export const command: Command = {
  name: 'make-model',
  summary: 'write a random-weight GGUF model (llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, phi3, qwen35, qwen35moe; any quant type) with a real tokenizer',
  usage: '--out <file> [options]',
  options: {
    out: { type: 'string', valueName: '<file>', description: 'GGUF file to write (required)' },
    arch: { type: 'string', valueName: ARCHS.join('|'), description: 'architecture', default: MODEL_DEFAULTS.arch },
    layers: { type: 'string', valueName: '<n>', description: 'transformer blocks', default: String(MODEL_DEFAULTS.layers) },
    embd: { type: 'string', valueName: '<n>', description: 'hidden size', default: String(MODEL_DEFAULTS.embd) },
    heads: { type: 'string', valueName: '<n>', description: 'attention heads', default: String(MODEL_DEFAULTS.heads) },
    'kv-heads': { type: 'string', valueName: '<n>', description: 'KV heads (fewer than heads = GQA); default: heads' },
    'head-dim': { type: 'string', valueName: '<n>', description: 'size of one attention head; default: embd/heads' },
    ffn: { type: 'string', valueName: '<n>', description: 'feed-forward size', default: String(MODEL_DEFAULTS.ffn) },
    vocab: { type: 'string', valueName: '<n>', description: 'vocabulary size', default: String(MODEL_DEFAULTS.vocab) },
    ctx: { type: 'string', valueName: '<n>', description: 'training context length', default: String(MODEL_DEFAULTS.ctx) },
    type: {
      type: 'string',
      valueName: MODEL_TYPES.join('|'),
      description: 'weight type (q4_k_m / q5_k_m mix Q4_K / Q5_K with Q6_K as llama.cpp does; others apply to every matrix)',
      default: MODEL_DEFAULTS.type,
    },
    seed: { type: 'string', valueName: '<n>', description: 'random seed (same options + seed = same bytes)', default: String(MODEL_DEFAULTS.seed) },
    tokenizer: { type: 'string', valueName: 'llama|gpt2', description: 'SentencePiece-style or byte-level BPE; default: llama for llama, gpt2 for qwen' },
    pre: { type: 'string', valueName: BPE_PRES.join('|'), description: 'gpt2 pre-tokenizer; default: llama-bpe for llama, qwen2 for qwen' },
    tied: { type: 'boolean', description: 'tie the output head to token_embd (no output.weight)' },
    experts: { type: 'string', valueName: '<n>', description: 'qwen2moe/qwen3moe/qwen35moe: experts per layer (default 4)' },
    'experts-used': { type: 'string', valueName: '<n>', description: 'qwen2moe/qwen3moe/qwen35moe: experts per token (default 2)' },
    'expert-ffn': { type: 'string', valueName: '<n>', description: 'qwen2moe/qwen3moe/qwen35moe: feed-forward size of one expert (default: ffn)' },
    'shared-ffn': { type: 'string', valueName: '<n>', description: 'qwen2moe/qwen35moe: feed-forward size of the shared expert (default: ffn)' },
    'linear-k-heads': { type: 'string', valueName: '<n>', description: 'qwen35*: Gated DeltaNet q/k heads (default: heads)' },
    'linear-v-heads': { type: 'string', valueName: '<n>', description: 'qwen35*: Gated DeltaNet v heads (default: 2 × linear-k-heads)' },
    'linear-head-dim': { type: 'string', valueName: '<n>', description: 'qwen35*: size of one DeltaNet head (default: head size)' },
    'conv-kernel': { type: 'string', valueName: '<n>', description: 'qwen35*: causal conv width (default 4)' },
    'full-attn-interval': { type: 'string', valueName: '<n>', description: 'qwen35*: every n-th block is full attention (default 4)' },
    'rope-dims': { type: 'string', valueName: '<n>', description: 'rotated dimensions per head (default: head size; qwen35*: a quarter of it)' },
    'sliding-window': { type: 'string', valueName: '<n>', description: 'gemma3: sliding-window size, 0 = none (default 512)' },
    'swa-pattern': { type: 'string', valueName: '<n>', description: 'gemma3: every n-th layer is global (default 6)' },
    'rope-scaling': { type: 'string', valueName: ROPE_SCALINGS.join('|'), description: 'rope.scaling.type (default none)' },
    'rope-factor': { type: 'string', valueName: '<x>', description: 'rope.scaling.factor for linear/yarn (default 4)' },
    'rope-orig-ctx': { type: 'string', valueName: '<n>', description: "original context of yarn and of phi3's long rope factors (default: ctx)" },
    'rope-freqs': { type: 'boolean', description: 'llama: write llama3-style rope_freqs.weight' },
    'header-only': { type: 'boolean', description: 'write only the header (full tensor infos, no tensor data)' },
  },
  async run(args) {
    const out = stringOption(args, 'out', true);
    const kvHeads = optionalIntOption(args, 'kv-heads');
    const headDim = optionalIntOption(args, 'head-dim');
    const tokenizer = choiceOption<TokenizerKind>(args, 'tokenizer', ['llama', 'gpt2']);
    const pre = choiceOption<BpePre>(args, 'pre', BPE_PRES);
    const opts: MakeModelOptions = {
      arch: choiceOption<SyntheticArch>(args, 'arch', ARCHS) ?? MODEL_DEFAULTS.arch,
      layers: intOption(args, 'layers', MODEL_DEFAULTS.layers),
      embd: intOption(args, 'embd', MODEL_DEFAULTS.embd),
      heads: intOption(args, 'heads', MODEL_DEFAULTS.heads),
      ffn: intOption(args, 'ffn', MODEL_DEFAULTS.ffn),
      vocab: intOption(args, 'vocab', MODEL_DEFAULTS.vocab),
      ctx: intOption(args, 'ctx', MODEL_DEFAULTS.ctx),
      type: choiceOption<ModelType>(args, 'type', MODEL_TYPES) ?? MODEL_DEFAULTS.type,
      seed: intOption(args, 'seed', MODEL_DEFAULTS.seed),
      headerOnly: args.values['header-only'] === true,
      tied: args.values.tied === true,
      ropeFreqs: args.values['rope-freqs'] === true,
      ...(kvHeads !== undefined ? { kvHeads } : {}),
      ...(headDim !== undefined ? { headDim } : {}),
      ...(tokenizer ? { tokenizer } : {}),
      ...(pre ? { pre } : {}),
    };
    const ints = {
      experts: 'experts', expertsUsed: 'experts-used', expertFfn: 'expert-ffn', sharedFfn: 'shared-ffn', slidingWindow: 'sliding-window', swaPattern: 'swa-pattern', ropeOrigCtx: 'rope-orig-ctx',
      linearKHeads: 'linear-k-heads', linearVHeads: 'linear-v-heads', linearHeadDim: 'linear-head-dim', convKernel: 'conv-kernel', fullAttnInterval: 'full-attn-interval', ropeDims: 'rope-dims',
    } as const;
    for (const [k, flag] of Object.entries(ints) as [keyof typeof ints, string][]) {
      const v = optionalIntOption(args, flag);
      if (v !== undefined) opts[k] = v;
    }
    const ropeScaling = choiceOption<RopeScaling>(args, 'rope-scaling', ROPE_SCALINGS);
    if (ropeScaling) opts.ropeScaling = ropeScaling;
    if (args.values['rope-factor'] !== undefined) opts.ropeFactor = numberOption(args, 'rope-factor', 4);
    const started = performance.now();
    const layout = await makeModelFile(out, opts);
    const seconds = (performance.now() - started) / 1000;
    console.log(`wrote ${out}: ${layout.fileBytes} bytes, ${layout.tensors.length} tensors, ${opts.arch} ${opts.type}, ${seconds.toFixed(2)} s`);
    return 0;
  },
};
