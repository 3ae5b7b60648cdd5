// The character classes our pre-tokenizers use must agree with llama.cpp's own Unicode tables
// (src/unicode-data.cpp of the llama.cpp that node-llama-cpp ships) on every code point. A
// JavaScript engine with a newer Unicode than the one checked here fails this test, and would
// split some words differently from llama.cpp.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { LLAMA_CPP_CLASSES } from '../src/model/tokenizer/pretokenize.ts';
import { llamaCppCheckout } from './tokenizer-fixtures.ts';

const NUMBER = 0x2;
const LETTER = 0x4;
const PUNCTUATION = 0x20;

function llamaCppTables(): { flags: Uint16Array; whitespace: Set<number> } {
  const src = readFileSync(join(llamaCppCheckout(), 'src', 'unicode-data.cpp'), 'utf8');
  const block = (name: string) => {
    const start = src.indexOf(`${name} = {`);
    expect(start, name).toBeGreaterThan(0);
    return src.slice(start, src.indexOf('};', start));
  };
  const ranges = [...block('unicode_ranges_flags').matchAll(/\{0x([0-9A-F]+), 0x([0-9A-F]+)\}/g)].map((m) => [parseInt(m[1]!, 16), parseInt(m[2]!, 16)]);
  const flags = new Uint16Array(0x110000);
  for (let i = 0; i + 1 < ranges.length; i++) flags.fill(ranges[i]![1]!, ranges[i]![0]!, ranges[i + 1]![0]!);
  const whitespace = new Set([...block('unicode_set_whitespace').matchAll(/0x([0-9A-F]+)/g)].map((m) => parseInt(m[1]!, 16)));
  return { flags, whitespace };
}

describe("pre-tokenizer character classes vs llama.cpp's Unicode tables", () => {
  it('agree on letters, numbers, punctuation and whitespace for every code point', () => {
    const { flags, whitespace } = llamaCppTables();
    const re = {
      letter: new RegExp(LLAMA_CPP_CLASSES.letter, 'v'),
      number: new RegExp(LLAMA_CPP_CLASSES.number, 'v'),
      punctuation: new RegExp(LLAMA_CPP_CLASSES.punctuation, 'v'),
      whitespace: new RegExp(LLAMA_CPP_CLASSES.whitespace, 'v'),
    };
    const differ: string[] = [];
    for (let cp = 0; cp < 0x110000; cp++) {
      if (cp >= 0xd800 && cp <= 0xdfff) continue; // not characters; UTF-8 input never holds them
      const ch = String.fromCodePoint(cp);
      const f = flags[cp]!;
      if (re.letter.test(ch) !== ((f & LETTER) !== 0) || re.number.test(ch) !== ((f & NUMBER) !== 0) || re.punctuation.test(ch) !== ((f & PUNCTUATION) !== 0) || re.whitespace.test(ch) !== whitespace.has(cp)) {
        differ.push(cp.toString(16));
      }
    }
    expect(differ.slice(0, 20), `${differ.length} code points differ (Unicode ${process.versions.unicode})`).toEqual([]);
  });
});
