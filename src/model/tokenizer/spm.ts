// SentencePiece BPE as llama.cpp runs it: start from single characters, repeatedly merge the
// adjacent pair whose concatenation is the highest-scoring token (ties: leftmost first), and
// spell whatever is left that is not a token as <0xNN> byte tokens.

import { MeshError } from '../../errors.ts';
import { Heap } from './heap.ts';
import { utf8Bytes } from './unicode.ts';
import type { Vocab } from './vocab.ts';

interface Bigram {
  left: number;
  right: number;
  score: number;
  /** UTF-16 length of the merged text; a stale entry no longer adds up to it */
  size: number;
}

const higherFirst = (a: Bigram, b: Bigram) => a.score > b.score || (a.score === b.score && a.left < b.left);

/** Token id of one byte: "<0xNN>", else a token spelled as that single character. */
export function byteToken(vocab: Vocab, byte: number): number {
  const hex = byte.toString(16).toUpperCase().padStart(2, '0');
  const id = vocab.ids.get(`<0x${hex}>`) ?? (byte < 0x80 ? vocab.ids.get(String.fromCharCode(byte)) : undefined);
  if (id === undefined) throw new MeshError('TOKENIZER_NO_BYTE_TOKEN', `the vocabulary has no token for byte 0x${hex} (<0x${hex}>)`);
  return id;
}

/** Tokenizes one fragment of text that has already had its spaces escaped to ▁. */
export function spmTokenize(vocab: Vocab, text: string, out: number[]): void {
  // symbols: one per code point, as a doubly linked list over [start, start+len) of `text`
  const starts: number[] = [];
  for (let i = 0; i < text.length; ) {
    starts.push(i);
    i += text.codePointAt(i)! > 0xffff ? 2 : 1;
  }
  const n = starts.length;
  if (n === 0) return;
  const start = Int32Array.from(starts);
  const len = new Int32Array(n);
  const prev = new Int32Array(n);
  const next = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    len[i] = (i + 1 < n ? start[i + 1]! : text.length) - start[i]!;
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }

  const queue = new Heap<Bigram>(higherFirst);
  const tryAdd = (left: number, right: number) => {
    if (left < 0 || right < 0) return;
    const size = len[left]! + len[right]!;
    const id = vocab.ids.get(text.substr(start[left]!, size));
    if (id === undefined) return;
    queue.push({ left, right, score: vocab.scores[id]!, size });
  };
  for (let i = 1; i < n; i++) tryAdd(i - 1, i);

  for (let b = queue.pop(); b !== undefined; b = queue.pop()) {
    const { left, right } = b;
    if (len[left] === 0 || len[right] === 0 || len[left]! + len[right]! !== b.size) continue;
    // merge right into left and unlink right
    len[left] = b.size;
    len[right] = 0;
    next[left] = next[right]!;
    if (next[right]! >= 0) prev[next[right]!] = left;
    tryAdd(prev[left]!, left);
    tryAdd(left, next[left]!);
  }

  for (let i = 0; i !== -1; i = next[i]!) {
    const piece = text.substr(start[i]!, len[i]!);
    const id = vocab.ids.get(piece);
    if (id !== undefined) {
      out.push(id);
      continue;
    }
    for (const byte of utf8Bytes(piece)) out.push(byteToken(vocab, byte));
  }
}
