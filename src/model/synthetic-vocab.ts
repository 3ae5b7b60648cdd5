// Real tokenizer metadata for synthetic models, learned deterministically from a small
// built-in English/code corpus so that tokenisation is meaningful (common words become single
// tokens). Two styles, as llama.cpp knows them:
//   llama — SentencePiece-style: <unk> <s> </s>, the 256 byte-fallback tokens <0x00>…<0xFF>,
//           single characters and ▁-prefixed pieces whose scores rank the merges
//   gpt2  — byte-level BPE: the 256 byte characters, pieces with their merge list, a
//           pre-tokenizer name (llama-bpe, qwen2 or gpt-2) and control tokens
// Both carry a ChatML chat template and its <|im_start|>/<|im_end|> control tokens. Vocabulary
// slots left over once the corpus has no pair seen twice are filled with unused control tokens
// `<|reserved_N|>` (as Llama 3 reserves its own), so any --vocab at or above the minimum works.

import { MeshError } from '../errors.ts';
import type { MetadataEntry } from '../gguf/writer.ts';

export type TokenizerKind = 'llama' | 'gpt2';
export type BpePre = 'llama-bpe' | 'qwen2' | 'qwen35' | 'gpt-2';
export const BPE_PRES: readonly BpePre[] = ['llama-bpe', 'qwen2', 'qwen35', 'gpt-2'];

/** llama.cpp token types (llama_token_type / tokenizer.ggml.token_type values). */
export enum TokenType {
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,
  USER_DEFINED = 4,
  UNUSED = 5,
  BYTE = 6,
}

export interface VocabOptions {
  kind: TokenizerKind;
  /** total number of tokens */
  vocabSize: number;
  /** gpt2 only: pre-tokenizer name written to tokenizer.ggml.pre (default llama-bpe) */
  pre?: BpePre;
}

export interface SyntheticVocab {
  tokens: string[];
  types: TokenType[];
  /** llama only: one score per token (higher merges first) */
  scores?: Float32Array;
  /** gpt2 only: "left right" merge rules, highest priority first */
  merges?: string[];
  bosId: number;
  eosId: number;
  /** the tokenizer.* metadata entries to put in a GGUF */
  metadata: MetadataEntry[];
}

/** A ChatML template (roles in <|im_start|>…<|im_end|> blocks), understood by llama.cpp. */
export const CHAT_TEMPLATE =
  "{%- for message in messages -%}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}" +
  "{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

// Written for this project: short stories, plain prose and a little code, so that the learned
// pieces cover everyday words, indentation, punctuation and numbers.
export const CORPUS = `
Once upon a time there was a small town by the sea. Every morning the people of the town
walked down to the water to watch the boats come in. A little girl named Mira loved the
boats more than anything. She knew the name of every boat and the color of every sail.
One day a boat she had never seen before came into the harbor. It was painted blue and
green, and its sail was the color of the sun. Mira ran down to the water to see it.
"Who are you?" she asked the old man who stood at the front of the boat.
"I am a traveler," he said. "I have been to many places, and I have many stories to tell."
Mira sat down on the sand and listened. The old man told her about mountains covered in
snow, about forests so thick that the light could not reach the ground, and about cities
where the streets were made of water. When he was done, the sun was going down.
"Will you come back tomorrow?" Mira asked. The old man smiled. "If the wind is kind."
The next morning Mira was the first one at the water. She waited and waited, and at last
she saw the blue and green boat on the edge of the sea. She was very happy.

The dog and the cat were good friends. They played in the garden every day after lunch.
The dog liked to run and jump, and the cat liked to sit in the sun and watch him. One day
the dog found a ball under a tree. He wanted to share it with the cat, so he pushed it to
her with his nose. The cat looked at the ball, then at the dog, and then she pushed it back.
They played with the ball until it was time for dinner. Then they went inside and slept.

Tom wanted to build a house for the birds in his yard. He asked his father for help. They
found some wood, a saw, a hammer and a box of nails. First they measured the wood, then
they cut it into pieces. Tom held the pieces while his father put in the nails. When the
house was finished, they painted it red and put it on a high branch. The next week, two
small birds came to live in it. Tom was proud of the house, and he watched the birds every
day. He learned that the birds ate seeds in the morning and sang in the evening.

The weather today will be warm and sunny, with a light wind from the west. In the
afternoon there may be a few clouds, but no rain is expected. Tomorrow will be cooler,
with a high of 18 degrees and a low of 9 degrees. On the weekend there is a chance of rain.
The train leaves at 7:45 in the morning and arrives at 10:30. Tickets cost 25 dollars for
adults and 12 dollars for children. Please keep your ticket until the end of the journey.
In 2024 the library had 3,500 books, 120 computers and 16 rooms for study and reading.

Learning a new language takes time and practice. It helps to read a little every day, to
listen to people who speak it, and to not be afraid of making mistakes. Many people find
that writing short notes is a good way to remember new words. The most important thing is
to keep going, even when it feels hard. After a few months you will be surprised at how
much you have learned. Questions are good: ask them whenever you do not understand.

A computer program is a list of instructions. The computer reads the instructions one by
one and does what they say. A function is a named group of instructions that can be used
again and again. A variable is a name for a value that can change while the program runs.
When the program has a bug, the programmer reads the code, finds the mistake and fixes it.

function add(a, b) {
  return a + b;
}

export function sum(values: number[]): number {
  let total = 0;
  for (const value of values) {
    total += value;
  }
  return total;
}

export class Counter {
  private count = 0;

  increment(): number {
    this.count += 1;
    return this.count;
  }

  reset(): void {
    this.count = 0;
  }
}

const names = ['alice', 'bob', 'carol'];
const upper = names.map((name) => name.toUpperCase());
console.log(upper.join(', '));
if (upper.length > 2 && upper[0] !== undefined) {
  console.log(\`first: \${upper[0]}\`);
}

def read_lines(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]

def count_words(lines):
    counts = {}
    for line in lines:
        for word in line.split():
            counts[word] = counts.get(word, 0) + 1
    return counts

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            return None
        return self.items.pop()

for i in range(10):
    print(i * i)

SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY name;
{"id": 42, "name": "example", "tags": ["one", "two"], "active": true, "score": 0.75}
The quick brown fox jumps over the lazy dog. What is your name? I am fine, thank you!
Café, naïve, résumé: words with accents. It's, don't, we'll, they've, I'd, you're.
`;

const SPM_SPACE = '\u2581'; // ▁

/** GPT-2's reversible byte → printable character map used by byte-level BPE vocabularies. */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const printable: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  const map: string[] = new Array(256);
  for (const b of printable) map[b] = String.fromCodePoint(b);
  let next = 256;
  for (let b = 0; b < 256; b++) if (map[b] === undefined) map[b] = String.fromCodePoint(next++);
  return map;
})();

/**
 * Byte-pair learning over word counts: repeatedly joins the most frequent adjacent pair
 * (ties → the smaller pair in code-unit order, so the result never depends on map order)
 * until `maxMerges` are learned or no pair occurs twice. Words are arrays of symbols.
 */
function learnMerges(wordCounts: Map<string, number>, split: (w: string) => string[], maxMerges: number): [string, string][] {
  const words = [...wordCounts.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([w, c]) => ({ syms: split(w), count: c }));
  const merges: [string, string][] = [];
  const SEP = '\u0000';
  while (merges.length < maxMerges) {
    const pairs = new Map<string, number>();
    for (const { syms, count } of words) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const k = syms[i] + SEP + syms[i + 1];
        pairs.set(k, (pairs.get(k) ?? 0) + count);
      }
    }
    let best = '';
    let bestCount = 1;
    for (const [k, c] of pairs) {
      if (c > bestCount || (c === bestCount && c > 1 && k < best)) {
        best = k;
        bestCount = c;
      }
    }
    if (bestCount < 2) break;
    const [a, b] = best.split(SEP) as [string, string];
    merges.push([a, b]);
    const joined = a + b;
    for (const w of words) {
      const s = w.syms;
      if (s.length < 2) continue;
      const out: string[] = [];
      for (let i = 0; i < s.length; i++) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) {
          out.push(joined);
          i++;
        } else out.push(s[i]!);
      }
      w.syms = out;
    }
  }
  return merges;
}

function countWords(words: Iterable<string>): Map<string, number> {
  const m = new Map<string, number>();
  for (const w of words) if (w) m.set(w, (m.get(w) ?? 0) + 1);
  return m;
}

const CHAT_TOKENS = ['<|im_start|>', '<|im_end|>'];

/** Distinct non-whitespace characters of the SentencePiece-normalised corpus, most frequent first. */
function spmBaseChars(): string[] {
  const freq = new Map<string, number>();
  for (const ch of CORPUS.replace(/ /g, SPM_SPACE)) {
    if (/\s/u.test(ch)) continue;
    freq.set(ch, (freq.get(ch) ?? 0) + 1);
  }
  if (!freq.has(SPM_SPACE)) freq.set(SPM_SPACE, 1);
  return [...freq.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([c]) => c);
}

function tooSmall(kind: string, vocabSize: number, min: number): MeshError {
  return new MeshError(
    'VOCAB_TOO_SMALL',
    `--vocab ${vocabSize} is too small for the ${kind} tokenizer: its fixed tokens (specials, 256 bytes${kind === 'llama' ? ', base characters' : ''}) need at least ${min}`,
  );
}

/** The smallest vocabulary a tokenizer style can be built with. */
export function minVocabSize(kind: TokenizerKind): number {
  return kind === 'llama' ? 3 + 256 + CHAT_TOKENS.length + spmBaseChars().length : 256 + 2 + CHAT_TOKENS.length;
}

function fillReserved(tokens: string[], types: TokenType[], vocabSize: number): void {
  for (let n = 0; tokens.length < vocabSize; n++) {
    tokens.push(`<|reserved_${n}|>`);
    types.push(TokenType.CONTROL);
  }
}

function buildSpm(vocabSize: number): SyntheticVocab {
  const tokens: string[] = ['<unk>', '<s>', '</s>'];
  const types: TokenType[] = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL];
  for (let b = 0; b < 256; b++) {
    tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    types.push(TokenType.BYTE);
  }
  for (const t of CHAT_TOKENS) {
    tokens.push(t);
    types.push(TokenType.CONTROL);
  }
  const base = spmBaseChars();
  const min = tokens.length + base.length;
  if (vocabSize < min) throw tooSmall('llama', vocabSize, min);
  const fixed = tokens.length;
  for (const c of base) {
    tokens.push(c);
    types.push(TokenType.NORMAL);
  }
  // SentencePiece sees text as ▁-prefixed words ("the cat" → "▁the", "▁cat")
  const words = countWords(CORPUS.split(/\s+/u).map((w) => (w ? SPM_SPACE + w : '')));
  const known = new Set(tokens);
  const merges = learnMerges(words, (w) => [...w], vocabSize - tokens.length);
  const pieceRank: number[] = [];
  for (const [a, b] of merges) {
    if (tokens.length >= vocabSize) break;
    const piece = a + b;
    if (known.has(piece)) continue;
    known.add(piece);
    pieceRank.push(tokens.length);
    tokens.push(piece);
    types.push(TokenType.NORMAL);
  }
  const nLearned = pieceRank.length;
  // llama.cpp joins the adjacent pair whose joined piece scores highest: earlier merges score higher
  const scores = new Float32Array(vocabSize);
  for (let i = 0; i < base.length; i++) scores[fixed + i] = -(nLearned + i);
  pieceRank.forEach((id, rank) => (scores[id] = -rank));
  fillReserved(tokens, types, vocabSize);
  const metadata: MetadataEntry[] = [
    { key: 'tokenizer.ggml.model', type: 'string', value: 'llama' },
    { key: 'tokenizer.ggml.tokens', type: 'array', itemType: 'string', value: tokens },
    { key: 'tokenizer.ggml.scores', type: 'array', itemType: 'float32', value: scores },
    { key: 'tokenizer.ggml.token_type', type: 'array', itemType: 'int32', value: types },
    { key: 'tokenizer.ggml.bos_token_id', type: 'uint32', value: 1 },
    { key: 'tokenizer.ggml.eos_token_id', type: 'uint32', value: 2 },
    { key: 'tokenizer.ggml.unknown_token_id', type: 'uint32', value: 0 },
    { key: 'tokenizer.ggml.add_bos_token', type: 'bool', value: true },
    { key: 'tokenizer.ggml.add_eos_token', type: 'bool', value: false },
    { key: 'tokenizer.ggml.add_space_prefix', type: 'bool', value: true },
    { key: 'tokenizer.chat_template', type: 'string', value: CHAT_TEMPLATE },
  ];
  return { tokens, types, scores, bosId: 1, eosId: 2, metadata };
}

// Training-time word splitters shaped like llama.cpp's pre-tokenizers, so learned merges fall
// inside the pieces those pre-tokenizers produce.
const PRE_SPLIT: Record<BpePre, RegExp> = {
  'llama-bpe': /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  qwen2: /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  qwen35: /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  'gpt-2': /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu,
};

/** Special tokens of each byte-level style: [bos, eos] (equal for gpt-2 and qwen2). */
const BPE_SPECIALS: Record<BpePre, { bos: string; eos: string }> = {
  'llama-bpe': { bos: '<|begin_of_text|>', eos: '<|end_of_text|>' },
  qwen2: { bos: '<|endoftext|>', eos: '<|endoftext|>' },
  qwen35: { bos: '<|endoftext|>', eos: '<|endoftext|>' },
  'gpt-2': { bos: '<|endoftext|>', eos: '<|endoftext|>' },
};

const utf8 = new TextEncoder();

function toByteChars(s: string): string {
  let out = '';
  for (const b of utf8.encode(s)) out += BYTE_TO_CHAR[b];
  return out;
}

function buildBpe(vocabSize: number, pre: BpePre): SyntheticVocab {
  const { bos, eos } = BPE_SPECIALS[pre];
  const specials = [...new Set([bos, eos, ...CHAT_TOKENS])];
  const min = 256 + specials.length;
  if (vocabSize < min) throw tooSmall('gpt2', vocabSize, min);
  const tokens: string[] = [...BYTE_TO_CHAR];
  const types: TokenType[] = tokens.map(() => TokenType.NORMAL);
  const words = countWords([...CORPUS.matchAll(PRE_SPLIT[pre])].map((m) => toByteChars(m[0])));
  const room = vocabSize - min;
  const known = new Set(tokens);
  const merges: string[] = [];
  for (const [a, b] of learnMerges(words, (w) => [...w], room)) {
    if (tokens.length >= vocabSize - specials.length) break;
    merges.push(`${a} ${b}`);
    const piece = a + b;
    if (known.has(piece)) continue;
    known.add(piece);
    tokens.push(piece);
    types.push(TokenType.NORMAL);
  }
  const ids: Record<string, number> = {};
  for (const s of specials) {
    ids[s] = tokens.length;
    tokens.push(s);
    types.push(TokenType.CONTROL);
  }
  fillReserved(tokens, types, vocabSize);
  const bosId = ids[bos]!;
  const eosId = ids[eos]!;
  const metadata: MetadataEntry[] = [
    { key: 'tokenizer.ggml.model', type: 'string', value: 'gpt2' },
    { key: 'tokenizer.ggml.pre', type: 'string', value: pre },
    { key: 'tokenizer.ggml.tokens', type: 'array', itemType: 'string', value: tokens },
    { key: 'tokenizer.ggml.token_type', type: 'array', itemType: 'int32', value: types },
    { key: 'tokenizer.ggml.merges', type: 'array', itemType: 'string', value: merges },
    { key: 'tokenizer.ggml.bos_token_id', type: 'uint32', value: bosId },
    { key: 'tokenizer.ggml.eos_token_id', type: 'uint32', value: eosId },
    // Llama 3 prepends <|begin_of_text|>; Qwen2 and GPT-2 add nothing
    { key: 'tokenizer.ggml.add_bos_token', type: 'bool', value: pre === 'llama-bpe' },
    { key: 'tokenizer.ggml.add_eos_token', type: 'bool', value: false },
    { key: 'tokenizer.chat_template', type: 'string', value: CHAT_TEMPLATE },
  ];
  return { tokens, types, merges, bosId, eosId, metadata };
}

/** Builds a tokenizer of exactly `vocabSize` tokens. Deterministic: same options → same vocab. */
export function buildVocab(opts: VocabOptions): SyntheticVocab {
  if (!Number.isSafeInteger(opts.vocabSize) || opts.vocabSize <= 0) {
    throw new MeshError('VOCAB_TOO_SMALL', `vocabulary size must be a positive integer, got ${opts.vocabSize}`);
  }
  if (opts.kind === 'llama') {
    if (opts.pre !== undefined) throw new MeshError('VOCAB_BAD_OPTION', `a pre-tokenizer (${opts.pre}) applies to gpt2 tokenizers only`);
    return buildSpm(opts.vocabSize);
  }
  if (opts.kind === 'gpt2') {
    const pre = opts.pre ?? 'llama-bpe';
    if (!BPE_PRES.includes(pre)) throw new MeshError('VOCAB_BAD_OPTION', `unknown pre-tokenizer '${pre}' (known: ${BPE_PRES.join(', ')})`);
    return buildBpe(opts.vocabSize, pre);
  }
  throw new MeshError('VOCAB_BAD_OPTION', `unknown tokenizer '${String(opts.kind)}' (known: llama, gpt2)`);
}
