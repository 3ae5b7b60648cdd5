// The vocabulary of a GGUF model, read from its `tokenizer.*` metadata the way llama.cpp reads
// it: token texts, scores and types, BPE merge ranks, special token ids (with llama.cpp's
// defaults), whether BOS/EOS are added, the end-of-generation set, and which tokens are
// "special" (split out of text before the tokenizer proper runs).

import { MeshError } from '../../errors.ts';
import type { MetadataValue } from '../../gguf/types.ts';
import { preTokenizerFor } from './pretokenize.ts';
import type { PreTokenizer } from './pretokenize.ts';

/** GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`). */
export const TokenType = {
  UNDEFINED: 0,
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  USER_DEFINED: 4,
  UNUSED: 5,
  BYTE: 6,
} as const;

/** Token attribute bits (llama.cpp `llama_token_attr`). */
export const Attr = {
  UNDEFINED: 0,
  UNKNOWN: 1 << 0,
  UNUSED: 1 << 1,
  NORMAL: 1 << 2,
  CONTROL: 1 << 3,
  USER_DEFINED: 1 << 4,
  BYTE: 1 << 5,
  LSTRIP: 1 << 7,
  RSTRIP: 1 << 8,
} as const;

const TYPE_TO_ATTR: Record<number, number> = {
  [TokenType.UNDEFINED]: Attr.UNDEFINED,
  [TokenType.NORMAL]: Attr.NORMAL,
  [TokenType.UNKNOWN]: Attr.UNKNOWN,
  [TokenType.CONTROL]: Attr.CONTROL,
  [TokenType.USER_DEFINED]: Attr.USER_DEFINED,
  [TokenType.UNUSED]: Attr.UNUSED,
  [TokenType.BYTE]: Attr.BYTE,
};

export type VocabKind = 'spm' | 'bpe';

export interface Vocab {
  kind: VocabKind;
  /** `tokenizer.ggml.model` as written in the file */
  model: string;
  /** token id → text as stored (SentencePiece ▁ or GPT-2 byte characters) */
  texts: string[];
  /** token id → SentencePiece score (0 when absent) */
  scores: Float32Array;
  /** token id → Attr bits */
  attrs: Uint16Array;
  /** text → token id */
  ids: Map<string, number>;
  /** BPE merges: "left right" → rank (lower merges first) */
  mergeRanks: Map<string, number>;
  /** BPE only: how text is cut into words before merging */
  preTokenizer: PreTokenizer | undefined;
  bos: number | undefined;
  eos: number | undefined;
  eot: number | undefined;
  unk: number | undefined;
  addBos: boolean;
  addEos: boolean;
  /** SentencePiece: prepend a space to text that starts a fragment after a special token */
  addSpacePrefix: boolean;
  /** BPE: a word that is already a token skips merging (Llama 3 style) */
  ignoreMerges: boolean;
  /** detokenize: drop spaces before punctuation (" ," → ",") as HF clean_up_tokenization_spaces does */
  cleanSpaces: boolean;
  /** end-of-generation token ids */
  eog: Set<number>;
  /** special token ids, longest text first: the order text is partitioned in */
  specialTokens: number[];
}

// Texts llama.cpp treats as end-of-generation wherever they appear in a vocabulary.
const EOG_TEXTS = new Set([
  '<|eot_id|>', '<|im_end|>', '<|end|>', '<|return|>', '<|call|>', '<|flush|>', '<|calls|>',
  '<end_of_turn>', '<|endoftext|>', '</s>', '<|eom_id|>', '<EOT>', '_<EOT>', '[EOT]', '[EOS]',
  '<|end_of_text|>', '<end_of_utterance>', '<eos>', '<turn|>', '<|tool_response>',
  '<｜end▁of▁sentence｜>', '[e~[',
]);
// Texts llama.cpp picks the EOT token from when the metadata names none.
const EOT_TEXTS = new Set([
  '<|eot_id|>', '<|im_end|>', '<|end|>', '<end_of_turn>', '<|endoftext|>', '<|end_of_text|>',
  '<EOT>', '_<EOT>', '[EOT]', '<｜end▁of▁sentence｜>', '<end_of_utterance>',
]);
type FimKind = 'pre' | 'suf' | 'mid' | 'pad' | 'rep' | 'sep';
const FIM_KINDS: readonly FimKind[] = ['pre', 'suf', 'mid', 'pad', 'rep', 'sep'];
// Texts llama.cpp recognises as fill-in-the-middle tokens when the metadata names none.
const FIM_TEXTS: Record<FimKind, readonly string[]> = {
  pre: ['<|fim_prefix|>', '<fim-prefix>', '<fim_prefix>', '<｜fim▁begin｜>', '<PRE>', '▁<PRE>', '<|code_prefix|>', '<|prefix|>'],
  suf: ['<|fim_suffix|>', '<fim-suffix>', '<fim_suffix>', '<｜fim▁hole｜>', '<SUF>', '▁<SUF>', '<|code_suffix|>', '<|suffix|>'],
  mid: ['<|fim_middle|>', '<fim-middle>', '<fim_middle>', '<｜fim▁end｜>', '<MID>', '▁<MID>', '<|code_middle|>', '<|middle|>'],
  pad: ['<|fim_pad|>', '<fim-pad>', '<fim_pad>', '<PAD>', '[PAD]'],
  rep: ['<|fim_repo|>', '<|repo_name|>', '<fim-repo>', '<REPO>', '<reponame>'],
  sep: ['<|file_sep|>'],
};
// gpt-oss channel markers are always rendered as text.
const ALWAYS_USER_DEFINED = new Set(['<|channel|>', '<|message|>', '<|start|>', '<|constrain|>']);

function metaString(meta: Record<string, MetadataValue>, key: string): string | undefined {
  const v = meta[key];
  return typeof v === 'string' ? v : undefined;
}

function metaBool(meta: Record<string, MetadataValue>, key: string): boolean | undefined {
  const v = meta[key];
  return typeof v === 'boolean' ? v : undefined;
}

function metaUint(meta: Record<string, MetadataValue>, key: string): number | undefined {
  const v = meta[key];
  if (typeof v === 'number' && Number.isInteger(v) && v >= 0) return v;
  if (typeof v === 'bigint' && v >= 0n && v <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(v);
  return undefined;
}

function metaArray(meta: Record<string, MetadataValue>, key: string): MetadataValue[] | undefined {
  const v = meta[key];
  return Array.isArray(v) ? v : undefined;
}

/** Reads the vocabulary from GGUF metadata; throws MeshError for what we cannot tokenize. */
export function readVocab(meta: Record<string, MetadataValue>): Vocab {
  const model = metaString(meta, 'tokenizer.ggml.model');
  if (model === undefined) {
    throw new MeshError('TOKENIZER_MISSING', 'the model has no tokenizer.ggml.model metadata');
  }
  let kind: VocabKind;
  if (model === 'llama') kind = 'spm';
  else if (model === 'gpt2') kind = 'bpe';
  else {
    throw new MeshError('TOKENIZER_UNSUPPORTED_MODEL', `unsupported tokenizer model '${model}' (supported: llama, gpt2)`, { model });
  }

  const rawTokens = metaArray(meta, 'tokenizer.ggml.tokens');
  if (!rawTokens || rawTokens.some((t) => typeof t !== 'string')) {
    throw new MeshError('TOKENIZER_MISSING_VOCAB', 'tokenizer.ggml.tokens is missing or not an array of strings');
  }
  const n = rawTokens.length;
  // @huggingface/gguf 0.4.6 decodes strings with a BOM-stripping TextDecoder, so the real
  // SentencePiece token "\ufeff" arrives as ''. A truly empty token is renamed by llama.cpp to
  // [EMPTY_i]; we take the first empty one to be the stripped BOM, which is what real vocabularies hold.
  let bomSeen = (rawTokens as string[]).includes('\ufeff');
  const texts = (rawTokens as string[]).map((t, i) => {
    if (t !== '') return t;
    if (!bomSeen) {
      bomSeen = true;
      return '\ufeff';
    }
    return `[EMPTY_${i}]`;
  });

  const scores = new Float32Array(n);
  const rawScores = metaArray(meta, 'tokenizer.ggml.scores');
  if (rawScores) {
    if (rawScores.length < n) throw new MeshError('TOKENIZER_BAD_METADATA', `tokenizer.ggml.scores has ${rawScores.length} entries for ${n} tokens`);
    for (let i = 0; i < n; i++) scores[i] = Number(rawScores[i]);
  }

  const attrs = new Uint16Array(n).fill(Attr.NORMAL);
  const rawTypes = metaArray(meta, 'tokenizer.ggml.token_type');
  if (rawTypes) {
    if (rawTypes.length < n) throw new MeshError('TOKENIZER_BAD_METADATA', `tokenizer.ggml.token_type has ${rawTypes.length} entries for ${n} tokens`);
    for (let i = 0; i < n; i++) attrs[i] = TYPE_TO_ATTR[Number(rawTypes[i])] ?? Attr.UNDEFINED;
  }

  const ids = new Map<string, number>();
  for (let i = 0; i < n; i++) ids.set(texts[i]!, i);

  const mergeRanks = new Map<string, number>();
  let preTokenizer: PreTokenizer | undefined;
  let addBos: boolean;
  let addSpacePrefix: boolean;
  let ignoreMerges = false;
  let cleanSpaces: boolean;
  // llama.cpp's default special ids per tokenizer model
  let bos: number | undefined = kind === 'spm' ? 1 : 11;
  let eos: number | undefined = kind === 'spm' ? 2 : 11;
  let unk: number | undefined = kind === 'spm' ? 0 : undefined;

  if (kind === 'bpe') {
    const merges = metaArray(meta, 'tokenizer.ggml.merges');
    if (!merges) throw new MeshError('TOKENIZER_MISSING_MERGES', 'a gpt2 tokenizer needs tokenizer.ggml.merges');
    for (let rank = 0; rank < merges.length; rank++) {
      const m = merges[rank];
      if (typeof m !== 'string') throw new MeshError('TOKENIZER_BAD_METADATA', 'tokenizer.ggml.merges must hold strings');
      // the pair splits at the first space after the first character; the first listing wins
      if (m.indexOf(' ', 1) > 0 && !mergeRanks.has(m)) mergeRanks.set(m, rank);
    }
    const pre = preTokenizerFor(metaString(meta, 'tokenizer.ggml.pre') ?? 'default');
    preTokenizer = pre;
    addBos = pre.addBos;
    ignoreMerges = pre.ignoreMerges;
    cleanSpaces = pre.cleanSpaces;
    addSpacePrefix = false;
  } else {
    addBos = true;
    addSpacePrefix = true;
    cleanSpaces = false;
  }
  addSpacePrefix = metaBool(meta, 'tokenizer.ggml.add_space_prefix') ?? addSpacePrefix;

  const inRange = (id: number | undefined) => (id !== undefined && id < n ? id : undefined);
  bos = inRange(bos);
  eos = inRange(eos);
  unk = inRange(unk);
  // a metadata id past the vocabulary is ignored (llama.cpp keeps its default)
  const fromMeta = (key: string, fallback: number | undefined) => {
    const id = metaUint(meta, `tokenizer.ggml.${key}`);
    return id !== undefined && id < n ? id : fallback;
  };
  bos = fromMeta('bos_token_id', bos);
  eos = fromMeta('eos_token_id', eos);
  unk = fromMeta('unknown_token_id', unk);
  let eot = fromMeta('eot_token_id', undefined);
  let eom = fromMeta('eom_token_id', undefined);
  // fill-in-the-middle ids; the deprecated prefix/suffix/middle keys win when both are present
  const fim: Record<FimKind, number | undefined> = {
    pre: fromMeta('prefix_token_id', fromMeta('fim_pre_token_id', undefined)),
    suf: fromMeta('suffix_token_id', fromMeta('fim_suf_token_id', undefined)),
    mid: fromMeta('middle_token_id', fromMeta('fim_mid_token_id', undefined)),
    pad: fromMeta('fim_pad_token_id', undefined),
    rep: fromMeta('fim_rep_token_id', undefined),
    sep: fromMeta('fim_sep_token_id', undefined),
  };

  addBos = metaBool(meta, 'tokenizer.ggml.add_bos_token') ?? addBos;
  const addEos = metaBool(meta, 'tokenizer.ggml.add_eos_token') ?? false;

  // Ids the metadata left unset are found by text, as llama.cpp does; what is found becomes a
  // control token. (llama.cpp scans a hash map, so where two texts qualify its pick is
  // unspecified; we take the lowest id.)
  for (let id = 0; id < n; id++) {
    const text = texts[id]!;
    if (eot === undefined && EOT_TEXTS.has(text)) {
      eot = id;
      attrs[id] = attrs[id]! | Attr.CONTROL;
    }
    if (eom === undefined && text === '<|eom_id|>') {
      eom = id;
      attrs[id] = attrs[id]! | Attr.CONTROL;
    }
    for (const kind of FIM_KINDS) {
      if (fim[kind] === undefined && FIM_TEXTS[kind].includes(text)) {
        fim[kind] = id;
        attrs[id] = attrs[id]! | Attr.CONTROL;
      }
    }
  }
  // control tokens named like "<unused12>" are unused
  for (let id = 0; id < n; id++) {
    if (attrs[id]! & Attr.CONTROL && texts[id]!.includes('unused')) attrs[id] = attrs[id]! | Attr.UNUSED;
  }

  // end-of-generation tokens: FIM pad/repo/file-separator, tokens with end-like texts, EOS/EOT/EOM
  const eog = new Set<number>([fim.pad, fim.rep, fim.sep].filter((id): id is number => id !== undefined));
  for (let id = 0; id < n; id++) {
    if (EOG_TEXTS.has(texts[id]!)) {
      eog.add(id);
      attrs[id] = attrs[id]! | Attr.CONTROL;
    }
  }
  for (let id = 0; id < n; id++) if (ALWAYS_USER_DEFINED.has(texts[id]!)) attrs[id] = Attr.USER_DEFINED;
  for (const id of [eos, eot, eom]) if (id !== undefined) eog.add(id);
  // gpt-oss: "<|end|>" ends a message, not the generation, when "<|return|>" and "<|call|>" exist
  const endId = ids.get('<|end|>');
  if (endId !== undefined && eog.has(endId) && ((ids.has('<|return|>') && ids.has('<|call|>')) || (ids.has('<|calls|>') && ids.has('<|flush|>')))) {
    eog.delete(endId);
    attrs[endId] = Attr.USER_DEFINED;
  }

  const specialTokens: number[] = [];
  for (let id = 0; id < n; id++) {
    if (attrs[id]! & (Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)) specialTokens.push(id);
  }
  // llama.cpp partitions with the longest (in UTF-8 bytes) special text first
  const encoder = new TextEncoder();
  const byteLen = new Map(specialTokens.map((id) => [id, encoder.encode(texts[id]!).length]));
  specialTokens.sort((a, b) => byteLen.get(b)! - byteLen.get(a)! || a - b);

  // Phi-3 strips the whitespace after its special tokens (llama.cpp sets this by model name).
  const name = (metaString(meta, 'general.name') ?? '').toLowerCase();
  if (name.includes('phi-3') || name.includes('phi3')) {
    for (const id of specialTokens) attrs[id] = attrs[id]! | Attr.RSTRIP;
    const set = (text: string, on: boolean) => {
      const id = ids.get(text);
      if (id !== undefined) attrs[id] = on ? attrs[id]! | Attr.RSTRIP : attrs[id]! & ~Attr.RSTRIP;
    };
    set('</s>', true);
    for (const t of ['<unk>', '<s>', '<|endoftext|>']) set(t, false);
  }

  return {
    kind, model, texts, scores, attrs, ids, mergeRanks, preTokenizer,
    bos, eos, eot, unk, addBos, addEos, addSpacePrefix, ignoreMerges, cleanSpaces, eog, specialTokens,
  };
}
