// Pre-tokenizers of byte-level BPE vocabularies: the regexes that cut text into words before
// merges run, chosen by `tokenizer.ggml.pre` as llama.cpp chooses them. Several regexes apply
// in turn, each splitting the pieces the previous one left (matches and the gaps between them).
//
// `\s` is spelled \p{White_Space} because llama.cpp's whitespace class is the Unicode
// White_Space property (it includes U+0085 and excludes U+FEFF, unlike JavaScript's \s).

import { MeshError } from '../../errors.ts';

const WS = '\\p{White_Space}';
const NOT_WS = '\\P{White_Space}';

// Code points assigned in Unicode 16.0 and 17.0. llama.cpp's category tables come from an
// older UnicodeData.txt and call them unassigned (neither letter, number nor punctuation),
// while V8 (Unicode 17 in Node 20.20) already classifies them; we subtract them from the
// classes so words split where llama.cpp splits them. Found by comparing llama.cpp's
// unicode-data table with V8's \p{…} classes over every code point (hex, inclusive ranges).
const NEWER_THAN_LLAMA_CPP =
  '88f 897 c5c cdc 1acf-1add 1ae0-1aeb 1b4e-1b4f 1b7f 1c89-1c8a 20c1 2427-2429 2b96 31e4-31e5 ' +
  'a7cb-a7cf a7d2 a7d4 a7da-a7dc a7f1 fbc3-fbd2 fd90-fd91 fdc8-fdce 105c0-105f3 10940-10959 ' +
  '10d40-10d65 10d69-10d85 10d8e-10d8f 10ec2-10ec7 10ed0-10ed8 10efa-10efc 11380-11389 1138b 1138e ' +
  '11390-113b5 113b7-113c0 113c2 113c5 113c7-113ca 113cc-113d5 113d7-113d8 113e1-113e2 116d0-116e3 ' +
  '11b60-11b67 11bc0-11be1 11bf0-11bf9 11db0-11ddb 11de0-11de9 11f5a 13460-143fa 16100-16139 ' +
  '16d40-16d79 16ea0-16eb8 16ebb-16ed3 16ff2-16ff6 187f8-187ff 18cff 18d09-18d1e 18d80-18df2 ' +
  '1cc00-1ccfc 1cd00-1ceb3 1ceba-1ced0 1cee0-1cef0 1e5d0-1e5fa 1e5ff 1e6c0-1e6de 1e6e0-1e6f5 ' +
  '1e6fe-1e6ff 1f6d8 1f777-1f77a 1f8b2-1f8bb 1f8c0-1f8c1 1f8d0-1f8d8 1fa54-1fa57 1fa89-1fa8a ' +
  '1fa8e-1fa8f 1fabe 1fac6 1fac8 1facd 1fadc 1fadf 1fae9-1faea 1faef 1fbcb-1fbef 1fbfa 2b73a-2b73f ' +
  '2cea2-2cead 323b0-33479';

const NEWER_CLASS = NEWER_THAN_LLAMA_CPP.split(' ')
  .map((r) => r.split('-').map((h) => `\\u{${h}}`).join('-'))
  .join('');
// letters, numbers and punctuation as llama.cpp's tables know them (needs the `v` flag)
const L = `[\\p{L}--[${NEWER_CLASS}]]`;
const N = `[\\p{N}--[${NEWER_CLASS}]]`;
const P = `[\\p{P}--[${NEWER_CLASS}]]`;
/** the character classes above, for tests that hold them against llama.cpp's tables */
export const LLAMA_CPP_CLASSES = { letter: L, number: N, punctuation: P, whitespace: `[${WS}]` };

// ' ?\p{L}+ …' — the original GPT-2 word regex (llama.cpp also ends it with a bare \s+).
const GPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?${L}+| ?${N}+| ?[^${WS}${L}${N}]+|${WS}+(?!${NOT_WS})|${WS}+`;

// Llama 3's regex with the (?i:…) contraction group spelled out; Qwen2 differs only in taking
// digits one at a time, Qwen3.5 in letting letter runs take combining marks (\p{M}) too.
function llama3Like(digits: string, marks = false): string {
  const M = marks ? '\\p{M}' : '';
  return (
    `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])` +
    `|[^\\r\\n${L}${N}]?${marks ? `[${L}${M}]` : L}+` +
    `|${N}${digits}` +
    `| ?[^${WS}${L}${M}${N}]+[\\r\\n]*` +
    `|${WS}*[\\r\\n]+` +
    `|${WS}+(?!${NOT_WS})` +
    `|${WS}+`
  );
}

const LLAMA3 = llama3Like('{1,3}');
const QWEN2 = llama3Like('');
const QWEN35 = llama3Like('', true);
// llama.cpp's fallback for BPE vocabularies without a known pre-tokenizer
const DEFAULT = [`[${P}$+<=>^~\\|]+`, GPT2, `${N}+`, '[0-9][0-9][0-9]'];

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
  qwen35: { regexes: [QWEN35], cleanSpaces: false },
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
    regexes: family.regexes.map((r) => new RegExp(r, 'gv')),
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
