// Pre-tokenizers of byte-level BPE vocabularies: the regexes that cut text into words before
// merges run, chosen by `tokenizer.ggml.pre` as llama.cpp chooses them. Several regexes apply
// in turn, each splitting the pieces the previous one left (matches and the gaps between them).
//
// `\s` is spelled \p{White_Space} because llama.cpp's whitespace class is the Unicode
// White_Space property (it includes U+0085 and excludes U+FEFF, unlike JavaScript's \s).

import { MeshError } from '../../errors.ts';

const WS = '\\p{White_Space}';
const NOT_WS = '\\P{White_Space}';

// ' ?\p{L}+ …' — the original GPT-2 word regex (llama.cpp also ends it with a bare \s+).
const GPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${WS}\\p{L}\\p{N}]+|${WS}+(?!${NOT_WS})|${WS}+`;

// Llama 3's regex with the (?i:…) contraction group spelled out; Qwen2 differs only in taking
// digits one at a time.
function llama3Like(digits: string): string {
  return (
    `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])` +
    `|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+` +
    `|\\p{N}${digits}` +
    `| ?[^${WS}\\p{L}\\p{N}]+[\\r\\n]*` +
    `|${WS}*[\\r\\n]+` +
    `|${WS}+(?!${NOT_WS})` +
    `|${WS}+`
  );
}

const LLAMA3 = llama3Like('{1,3}');
const QWEN2 = llama3Like('');
// llama.cpp's fallback for BPE vocabularies without a known pre-tokenizer
const DEFAULT = ['[\\p{P}$+<=>^~|]+', GPT2, '\\p{N}+', '[0-9][0-9][0-9]'];

export interface PreTokenizer {
  /** the `tokenizer.ggml.pre` value it was chosen for */
  name: string;
  regexes: RegExp[];
  /** BOS is added unless metadata says otherwise */
  addBos: boolean;
  /** a word that is already a token is emitted whole */
  ignoreMerges: boolean;
  /** detokenizing removes spaces before punctuation */
  cleanSpaces: boolean;
}

interface Family {
  regexes: string[];
  addBos?: boolean;
  ignoreMerges?: boolean;
  cleanSpaces: boolean;
}

const LLAMA3_FAMILY: Family = { regexes: [LLAMA3], addBos: true, ignoreMerges: true, cleanSpaces: true };
const GPT2_FAMILY: Family = { regexes: [GPT2], cleanSpaces: true };
const QWEN2_FAMILY: Family = { regexes: [QWEN2], cleanSpaces: false };

// `tokenizer.ggml.pre` values whose behaviour matches one of the families above in llama.cpp
const FAMILIES: Record<string, Family> = {
  default: { regexes: DEFAULT, cleanSpaces: true },
  ...Object.fromEntries(
    ['llama3', 'llama-v3', 'llama-bpe', 'falcon3', 'falcon-h1', 'pixtral', 'midm-2.0', 'lfm2', 'jina-v5-nano'].map((k) => [k, LLAMA3_FAMILY]),
  ),
  dbrx: { regexes: [LLAMA3], cleanSpaces: true },
  'smaug-bpe': { regexes: [LLAMA3], cleanSpaces: true },
  ...Object.fromEntries(
    ['gpt-2', 'phi-2', 'jina-es', 'jina-de', 'gigachat', 'jina-v2-es', 'jina-v2-de', 'a.x-4.0', 'mellum', 'modern-bert', 'mpt', 'olmo', 'jais', 'exaone4'].map(
      (k) => [k, GPT2_FAMILY],
    ),
  ),
  trillion: { regexes: [GPT2], cleanSpaces: false },
  'granite-docling': { regexes: [GPT2], cleanSpaces: false },
  ...Object.fromEntries(['qwen2', 'deepseek-r1-qwen', 'kormo', 'f2llmv2', 'hunyuan', 'solar-open'].map((k) => [k, QWEN2_FAMILY])),
  stablelm2: { regexes: [QWEN2], cleanSpaces: true },
  megrez: { regexes: [QWEN2], cleanSpaces: true },
};

export const SUPPORTED_PRE_TOKENIZERS = Object.keys(FAMILIES);

export function preTokenizerFor(name: string): PreTokenizer {
  const family = Object.hasOwn(FAMILIES, name) ? FAMILIES[name] : undefined;
  if (!family) {
    throw new MeshError('TOKENIZER_UNSUPPORTED_PRE', `unsupported pre-tokenizer '${name}' (tokenizer.ggml.pre); supported: ${SUPPORTED_PRE_TOKENIZERS.join(', ')}`, {
      pre: name,
    });
  }
  return {
    name,
    regexes: family.regexes.map((r) => new RegExp(r, 'gu')),
    addBos: family.addBos ?? false,
    ignoreMerges: family.ignoreMerges ?? false,
    cleanSpaces: family.cleanSpaces,
  };
}

/** Cuts text into the words BPE merges run on. Every character lands in exactly one word. */
export function preTokenize(pre: PreTokenizer, text: string): string[] {
  let pieces = text === '' ? [] : [text];
  for (const re of pre.regexes) {
    const next: string[] = [];
    for (const piece of pieces) {
      let last = 0;
      re.lastIndex = 0;
      for (let m = re.exec(piece); m !== null; m = re.exec(piece)) {
        if (m.index > last) next.push(piece.slice(last, m.index));
        next.push(m[0]);
        last = m.index + m[0].length;
      }
      if (last < piece.length) next.push(piece.slice(last));
    }
    pieces = next;
  }
  return pieces;
}
