// Unicode helpers the tokenizers share: UTF-8 encoding of JavaScript strings (lone surrogates
// become U+FFFD, as when node-llama-cpp hands text to llama.cpp) and GPT-2's reversible
// byte ↔ printable-character table.

const utf8Encoder = new TextEncoder();

/** UTF-8 bytes of a string; lone surrogates become U+FFFD (as V8 does when handing text to C++). */
export function utf8Bytes(text: string): Uint8Array {
  return utf8Encoder.encode(text);
}

/** The same string with lone surrogates replaced by U+FFFD. */
export function wellFormed(text: string): string {
  // String.prototype.toWellFormed exists from Node 20 / Chrome 111.
  const s = text as string & { toWellFormed?: () => string };
  return typeof s.toWellFormed === 'function' ? s.toWellFormed() : new TextDecoder('utf-8', { ignoreBOM: true }).decode(utf8Bytes(text));
}

/**
 * GPT-2's reversible byte → printable character table: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes take code points 256, 257, … in byte order.
 */
function buildByteTable(): { byteToChar: string[]; charToByte: Map<number, number> } {
  const byteToChar: string[] = new Array(256);
  const charToByte = new Map<number, number>();
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const cp = printable(b) ? b : next++;
    byteToChar[b] = String.fromCodePoint(cp);
    charToByte.set(cp, b);
  }
  return { byteToChar, charToByte };
}

const BYTE_TABLE = buildByteTable();

/** GPT-2 byte-level encoding of UTF-8 bytes: one printable character per byte. */
export function bytesToByteChars(bytes: Uint8Array): string {
  let out = '';
  for (const b of bytes) out += BYTE_TABLE.byteToChar[b];
  return out;
}

/** The byte a GPT-2 byte character stands for, or undefined for a character outside the table. */
export function byteCharToByte(codePoint: number): number | undefined {
  return BYTE_TABLE.charToByte.get(codePoint);
}
