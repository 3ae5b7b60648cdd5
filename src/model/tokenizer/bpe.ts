// Byte-level BPE as llama.cpp runs it: pre-tokenize into words, spell each word's UTF-8 bytes
// as GPT-2 byte characters, then repeatedly merge the adjacent pair with the lowest merge rank
// (ties: leftmost first). Pieces that end up without a token fall back to single-byte tokens.

import { Heap } from './heap.ts';
import { preTokenize } from './pretokenize.ts';
import { bytesToByteChars, utf8Bytes } from './unicode.ts';
import type { Vocab } from './vocab.ts';

interface Bigram {
  left: number;
  right: number;
  rank: number;
  /** the merged text; a stale entry no longer matches its two symbols */
  text: string;
}

const lowerFirst = (a: Bigram, b: Bigram) => a.rank < b.rank || (a.rank === b.rank && a.left < b.left);

// Words repeat a lot in real text; remembering their tokens keeps long prompts fast.
const WORD_CACHE_LIMIT = 50_000;

export class BpeSession {
  private readonly cache = new Map<string, number[]>();

  constructor(private readonly vocab: Vocab) {}

  tokenize(text: string, out: number[]): void {
    for (const word of preTokenize(this.vocab.preTokenizer!, text)) {
      const chars = bytesToByteChars(utf8Bytes(word));
      let ids = this.cache.get(chars);
      if (!ids) {
        ids = this.tokenizeWord(chars);
        if (this.cache.size >= WORD_CACHE_LIMIT) this.cache.clear();
        this.cache.set(chars, ids);
      }
      for (const id of ids) out.push(id);
    }
  }

  /** `word` is in GPT-2 byte characters. */
  private tokenizeWord(word: string): number[] {
    const { vocab } = this;
    if (vocab.ignoreMerges) {
      const whole = vocab.ids.get(word);
      if (whole !== undefined) return [whole];
    }
    // symbols: one per character, a linked list of substrings of `word`
    const syms: string[] = Array.from(word);
    const n = syms.length;
    const prev = new Int32Array(n);
    const next = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    const queue = new Heap<Bigram>(lowerFirst);
    const tryAdd = (left: number, right: number) => {
      if (left < 0 || right < 0) return;
      const rank = vocab.mergeRanks.get(`${syms[left]} ${syms[right]}`);
      if (rank === undefined) return;
      queue.push({ left, right, rank, text: syms[left]! + syms[right]! });
    };
    for (let i = 1; i < n; i++) tryAdd(i - 1, i);

    for (let b = queue.pop(); b !== undefined; b = queue.pop()) {
      const { left, right } = b;
      if (syms[left] === '' || syms[right] === '' || syms[left]! + syms[right]! !== b.text) continue;
      syms[left] = b.text;
      syms[right] = '';
      next[left] = next[right]!;
      if (next[right]! >= 0) prev[next[right]!] = left;
      tryAdd(prev[left]!, left);
      tryAdd(left, next[left]!);
    }

    const ids: number[] = [];
    for (let i = 0; i !== -1 && n > 0; i = next[i]!) {
      const id = vocab.ids.get(syms[i]!);
      if (id !== undefined) {
        ids.push(id);
        continue;
      }
      // llama.cpp looks each byte of the piece up as a one-byte token and drops what it cannot find
      for (const byte of utf8Bytes(syms[i]!)) {
        const byteId = byte < 0x80 ? vocab.ids.get(String.fromCharCode(byte)) : undefined;
        if (byteId !== undefined) ids.push(byteId);
      }
    }
    return ids;
  }
}
