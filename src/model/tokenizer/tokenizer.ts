// The tokenizer of a GGUF model: text ↔ token ids exactly as llama.cpp does it, for
// SentencePiece (`tokenizer.ggml.model` = llama) and byte-level BPE (gpt2) vocabularies.

import { MeshError } from '../../errors.ts';
import type { MetadataValue } from '../../gguf/types.ts';
import { BpeSession } from './bpe.ts';
import { partitionSpecial } from './special.ts';
import { spmTokenize } from './spm.ts';
import { byteCharToByte, wellFormed } from './unicode.ts';
import { Attr, readVocab } from './vocab.ts';
import type { Vocab } from './vocab.ts';

export interface EncodeOptions {
  /** add BOS/EOS where the model asks for them (default true) */
  addSpecial?: boolean;
  /** turn control-token texts such as "<s>" found in the text into their tokens (default true) */
  parseSpecial?: boolean;
}

export interface DecodeOptions {
  /** render control and unknown tokens as their text instead of nothing (default false) */
  special?: boolean;
}

const SPECIAL_ATTRS = Attr.UNKNOWN | Attr.CONTROL;
const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder('utf-8', { ignoreBOM: true });

/**
 * Encode and decode with a model's own vocabulary:
 *   const tok = Tokenizer.fromMetadata(header.metadata);
 *   const ids = tok.encode(prompt);            // BOS added, special-token texts parsed
 *   const text = tok.decode(ids);              // control tokens hidden unless { special: true }
 * For generated tokens use StreamingDecoder, which never splits a UTF-8 character.
 */
export class Tokenizer {
  readonly vocab: Vocab;
  private readonly bpe: BpeSession | undefined;
  /** token id → its bytes when rendered with special = true (built on first use) */
  private readonly pieces: (Uint8Array | undefined)[];

  constructor(vocab: Vocab) {
    this.vocab = vocab;
    this.bpe = vocab.kind === 'bpe' ? new BpeSession(vocab) : undefined;
    this.pieces = new Array(vocab.texts.length);
  }

  static fromMetadata(metadata: Record<string, MetadataValue>): Tokenizer {
    return new Tokenizer(readVocab(metadata));
  }

  get size(): number {
    return this.vocab.texts.length;
  }
  get bos(): number | undefined {
    return this.vocab.bos;
  }
  get eos(): number | undefined {
    return this.vocab.eos;
  }
  /** end-of-turn token (e.g. <|eot_id|>, <|im_end|>), where the vocabulary has one */
  get eot(): number | undefined {
    return this.vocab.eot;
  }
  /** whether encode() with addSpecial puts BOS first */
  get addsBos(): boolean {
    return this.vocab.addBos;
  }

  /** whether encode() with addSpecial puts EOS last */
  get addsEos(): boolean {
    return this.vocab.addEos;
  }

  /** true for tokens that end generation (EOS, EOT, <|im_end|>, …) */
  isEog(id: number): boolean {
    return this.vocab.eog.has(id);
  }

  /** The token's text as stored in the vocabulary (▁ / byte characters not undone). */
  tokenText(id: number): string {
    this.check(id);
    return this.vocab.texts[id]!;
  }

  encode(text: string, { addSpecial = true, parseSpecial = true }: EncodeOptions = {}): number[] {
    const v = this.vocab;
    const out: number[] = [];
    if (addSpecial && v.addBos) out.push(this.required(v.bos, 'BOS'));
    const fragments = partitionSpecial(v, wellFormed(text), parseSpecial);
    if (v.kind === 'spm') {
      // a fragment at the start or right after a special token gets the space prefix
      let prevSpecial = true;
      for (const f of fragments) {
        if ('token' in f) {
          out.push(f.token);
          prevSpecial = true;
          continue;
        }
        const raw = v.addSpacePrefix && prevSpecial ? ' ' + f.text : f.text;
        spmTokenize(v, raw.replaceAll(' ', '\u2581'), out);
        prevSpecial = false;
      }
    } else {
      for (const f of fragments) {
        if ('token' in f) out.push(f.token);
        else this.bpe!.tokenize(f.text, out);
      }
    }
    if (addSpecial && v.addEos) out.push(this.required(v.eos, 'EOS'));
    return out;
  }

  /**
   * The bytes one token stands for (a byte token may be part of a UTF-8 sequence). Control
   * and unknown tokens give no bytes unless `special`. The array is shared: do not modify it.
   */
  tokenPiece(id: number, { special = false }: DecodeOptions = {}): Uint8Array {
    this.check(id);
    if (!special && this.vocab.attrs[id]! & SPECIAL_ATTRS) return new Uint8Array(0);
    let piece = this.pieces[id];
    if (!piece) this.pieces[id] = piece = this.renderPiece(id);
    return piece;
  }

  /** Text of a token sequence, as llama.cpp's detokenizer gives it (node-llama-cpp `detokenize`). */
  decode(ids: readonly number[], { special = false }: DecodeOptions = {}): string {
    return utf8Decoder.decode(this.decodeBytes(ids, { special }));
  }

  decodeBytes(ids: readonly number[], { special = false }: DecodeOptions = {}): Uint8Array {
    const chunks: Uint8Array[] = [];
    let total = 0;
    // SentencePiece: the space prefix encode() added is dropped from the first token
    let stripSpace = this.vocab.addSpacePrefix;
    for (const id of ids) {
      let piece = this.tokenPiece(id, { special });
      if (stripSpace && piece.length > 0 && piece[0] === 0x20) piece = piece.subarray(1);
      stripSpace = false;
      chunks.push(piece);
      total += piece.length;
    }
    let bytes: Uint8Array = new Uint8Array(total);
    let at = 0;
    for (const c of chunks) {
      bytes.set(c, at);
      at += c.length;
    }
    if (this.vocab.cleanSpaces) bytes = cleanSpaces(bytes);
    return bytes;
  }

  private renderPiece(id: number): Uint8Array {
    const v = this.vocab;
    const attr = v.attrs[id]!;
    const text = v.texts[id]!;
    if (attr & (SPECIAL_ATTRS | Attr.USER_DEFINED)) return utf8.encode(text);
    if (attr & Attr.NORMAL) {
      if (v.kind === 'spm') return utf8.encode(text.replaceAll('\u2581', ' '));
      return byteCharsToBytes(text);
    }
    if (attr & Attr.BYTE) return Uint8Array.of(parseInt(text.slice(3, 5), 16));
    return new Uint8Array(0);
  }

  private check(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocab.texts.length) {
      throw new MeshError('TOKEN_OUT_OF_RANGE', `token id ${id} is not in the vocabulary of ${this.vocab.texts.length} tokens`, { id });
    }
  }

  private required(id: number | undefined, what: string): number {
    if (id === undefined) throw new MeshError('TOKENIZER_NO_SPECIAL', `the model asks for a ${what} token but defines none`);
    return id;
  }
}

/** GPT-2 byte characters back to bytes; a character outside the table is kept visible as llama.cpp does. */
function byteCharsToBytes(text: string): Uint8Array {
  const out: number[] = [];
  for (const ch of text) {
    const b = byteCharToByte(ch.codePointAt(0)!);
    if (b !== undefined) {
      out.push(b);
      continue;
    }
    const hex = Array.from(utf8.encode(ch), (x) => x.toString(16).padStart(2, '0')).join('');
    out.push(...utf8.encode(`[UNK_BYTE_0x${hex}${text}]`));
  }
  return Uint8Array.from(out);
}

/**
 * llama.cpp's clean_up_tokenization_spaces, byte for byte: " ?", " !", " .", " ," lose the
 * space; " ' " loses both spaces; " 's", " 'm", " 're", " 've" lose the space.
 */
function cleanSpaces(input: Uint8Array): Uint8Array {
  const SP = 0x20, Q = 0x27;
  const ch = (s: string) => s.charCodeAt(0);
  let text = Array.from(input);
  // pass 1: space before ? ! . ,
  let out: number[] = text.length ? [text[0]!] : [];
  for (let i = 1; i < text.length; i++) {
    const x = text[i]!;
    if (text[i - 1] === SP && (x === ch('?') || x === ch('!') || x === ch('.') || x === ch(','))) out.pop();
    out.push(x);
  }
  // pass 2: " ' " → "'"
  text = out;
  out = text.length ? [text[0]!] : [];
  for (let i = 1; i < text.length; i++) {
    const x = text[i]!;
    if (x === Q && i + 1 < text.length && text[i - 1] === SP && text[i + 1] === SP) {
      out.pop();
      out.push(x);
      // llama.cpp overwrites the next space with NUL (seen as the previous byte next time) and skips it
      text[++i] = 0;
      continue;
    }
    out.push(x);
  }
  // pass 3: contractions
  text = out;
  out = text.length ? [text[0]!] : [];
  for (let i = 1; i < text.length; i++) {
    const x = text[i]!;
    if (text[i - 1] === SP && x === Q && i + 1 < text.length) {
      const x1 = text[i + 1]!;
      if (x1 === ch('s') || x1 === ch('m')) out.pop();
      else if (i + 2 < text.length && x1 !== ch('t') && x1 !== ch('d')) {
        const x2 = text[i + 2]!;
        if ((x1 === ch('r') && x2 === ch('e')) || (x1 === ch('v') && x2 === ch('e'))) out.pop();
      }
    }
    out.push(x);
  }
  return Uint8Array.from(out);
}
