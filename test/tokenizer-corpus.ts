// Strings every tokenizer test runs through: hand-picked edge cases (whitespace runs, digits,
// punctuation, accents, CJK, emoji and ZWJ sequences, lone UTF-16 surrogates, special-token
// texts inside text, the empty string) plus seeded random mixes of the same ingredients.

import { mulberry32 } from './support/prng.ts';

const HAND_PICKED: string[] = [
  '',
  ' ', '  ', '   ', '    ', '        ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r\n\r\n', '\r', ' \n', '\n ', ' \n ',
  '\t\n', ' \t \n \r\n ', 'a  b', 'a   b', 'a\tb', 'a\nb', 'a\n\nb', 'a \n b', 'a\r\nb', '  leading', 'trailing  ', '  both  ',
  'tabs\tand\tspaces  mixed \t here', 'line one\nline two\n\nline four', '\u00a0nbsp\u00a0', 'ideographic\u3000space',
  'next\u0085line', 'line\u2028sep', 'para\u2029sep', 'zero\u200bwidth', '\ufeffbom', 'thin\u2009space', 'em\u2003space',
  '1', '12', '123', '1234', '12345', '123456', '1234567', '0', '00', '007', '3.14159', '-42', '+7', '1,000,000', '1e10', '0x1F',
  '2024-01-15', '12:34:56', '$100.00', '50%', '10/20', 'v1.2.3', 'a1b2c3', 'abc123def', '١٢٣', '٣٤٥٦', '१२३', '①②③', '½ ¾',
  'Ⅻ', '²³', '１２３', 'number 42 is 42', '9999999999999',
  '.', '..', '...', '!', '!!', '!!!', '?', '?!', '...?!', ',', ';', ':', '-', '--', '---', '—', '–', '_', '__init__', '()', '(a)',
  '[x]', '{}', '{"key": "value"}', '<>', '<<>>', '@user', '#tag', '$var', '%d', '^_^', '&amp;', '*bold*', '~tilde~', '`code`',
  '|pipe|', '\\backslash\\', '/path/to/file', 'a/b\\c', "'", "''", '"', '""', "it's", "It's", "IT'S", "we'll", "WE'LL", "they're",
  "THEY'RE", "I've", "I'm", "I'd", "don't", "DON'T", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", " 's", "x's y", "rock 'n' roll",
  "'quoted'", '"double quoted"', '« guillemets »', '„Anführung“', '¿Qué?', '¡Hola!', 'end.', 'a.b.c', 'e.g.', 'i.e.,', 'Hello, world!',
  'Hello world', ' Hello world', 'Hello World', ' Hello World', ' Hello World!', 'hello   world', 'HELLO WORLD', 'hElLo WoRlD',
  'café', 'naïve', 'résumé', 'Äpfel', 'Ölfass', 'Übermut', 'straße', 'señor', 'crème brûlée', 'e\u0301', 'a\u0308', 'n\u0303o',
  'Zoë', 'ångström', 'Ørsted', 'ﬁ ligature', 'ǅ', 'ı', 'İstanbul', 'ΑΒΓ αβγ', 'Ελληνικά', 'Русский текст', 'нещо на Български',
  'Українська', 'עברית', 'العربية', 'فارسی', 'हिन्दी', 'বাংলা', 'தமிழ்', 'ไทย', 'ລາວ', 'ქართული', 'Հայերեն', 'አማርኛ', 'ᚠᛇᚻ',
  '你好', '你好世界', '中文文本测试', '日本語のテキスト', 'ひらがな', 'カタカナ', '한국어', '안녕하세요', '漢字かなカナ', '繁體中文',
  '𠀀𠀁', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𝟘𝟙𝟚', '中文123English', 'mixed中文and English',
  '🦙', '🦙🦙', ' 🦙', 'this is 🦙.cpp', '😀', '😀😃😄', '👍', '👍🏽', '👨‍👩‍👧‍👦', '👩‍💻', '🏳️‍🌈', '🏴‍☠️', '🇺🇸', '🇺🇸🇬🇧', '❤️', '✔', '☃',
  '⌘', '♠♥♦♣', '€£¥', '∑∫√∞', '≤≥≠', '→←↑↓', '©®™', '°C', 'µs', 'Ω', '🀄', '🃏', '🎉 party 🎉', 'emoji😀inside',
  '\ud800', '\udfff', 'a\ud800b', 'a\udc00b', '\ud83d', '\ud83d\ude00\ud83d', 'x\ud800\ud800y', '\udc00\ud800',
  '<s>', '</s>', '<unk>', '<s>hello', 'hello</s>', 'a<s>b', ' <s> ', '<s><s>', '<s></s>', '<|endoftext|>', 'x<|endoftext|>y',
  '<|im_start|>user\nhi<|im_end|>', '<|begin_of_text|>', '<|eot_id|>', '<|start_header_id|>user<|end_header_id|>', '<|fim_prefix|>',
  '<0x41>', '<0xFF>', '<s', 's>', '<', '>', '< s >', '[INST]', '<<SYS>>', '<|', '|>',
  'def f(x):\n    return x * 2\n', 'for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}', 'SELECT * FROM t WHERE id = 1;',
  '<div class="x">text</div>', 'https://example.com/path?q=1&r=2#frag', 'user@example.com', 'C:\\Windows\\System32',
  '#!/bin/bash\necho "$HOME"', 'x = [1, 2, 3]', 'if a != b && c >= d || !e', '// comment', '/* block */', '# heading\n- item',
  '   \n\n   indented', 'Once upon a time', ' Once upon a time', 'Once upon a time, there was a little girl named Lily.',
  'The quick brown fox jumps over the lazy dog.', 'Lorem ipsum dolor sit amet, consectetur adipiscing elit.',
  '\u0000', 'a\u0000b', '\u0001\u0002', '\u007f', '\u001b[31mred\u001b[0m', '\u00ad', '\u200d', '\u200c', '\u2060', '\ue000', '\uffff',
  '\ufffd', '\ufffe', String.fromCodePoint(0x10ffff), String.fromCodePoint(0xe0041), 'a\u0300\u0301\u0302',
  // assigned only in Unicode 16/17, which llama.cpp's tables (older) still treat as unassigned
  'a\u1c89b Ᲊx', '\ua7cb\ua7cc test', 'x\u{10d40}\u{10d41}y 12', '🫩 face', 'new\u{11380}\u{11381} script', '\u20c1 sign',
];

const INGREDIENTS = [
  'the', 'The', ' cat', 'running', 'quickly', "'s", "'LL", '123', '4567', '0', ' ', '  ', '   ', '\t', '\n', '\r\n', '\n\n', '.', ',',
  '!', '?', '...', '-', '(', ')', '"', "'", '<s>', '</s>', '<|endoftext|>', 'é', 'ü', 'ñ', 'ß', '中', '文', 'の', '한', '🦙', '👍🏽',
  '👨‍👩‍👧', '\u200d', '\ud800', '\u00a0', '\u3000', '١٢', 'Ω', '€', '∑', 'Привет', 'world', 'hello', 'A', 'z', '_', '/', '\\', '#',
];

function randomStrings(count: number, seed: number): string[] {
  const next = mulberry32(seed);
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    const parts = 1 + Math.floor(next() * 12);
    let s = '';
    for (let j = 0; j < parts; j++) s += INGREDIENTS[Math.floor(next() * INGREDIENTS.length)];
    out.push(s);
  }
  return out;
}

/** A long realistic prompt (about 4 KB) for performance checks. */
export const LONG_PROMPT = Array.from(
  { length: 40 },
  (_, i) => `Paragraph ${i + 1}: Once upon a time, in a land far away, a curious llama named Lily (age ${i * 3}) asked "why?" — and the answer was 42.\n`,
).join('');

// One code point from several blocks new in Unicode 16/17 (letters, digits, symbols, marks), in
// the contexts where llama.cpp's older tables split differently: before "'s", after a space,
// between digits.
const NEWER_UNICODE = [0x88f, 0x1c89, 0xa7cb, 0x105c0, 0x10d40, 0x10d45, 0x11380, 0x16100, 0x1cc00, 0x1e5d0, 0x1fae9, 0x2b73a];
const NEWER_UNICODE_STRINGS = NEWER_UNICODE.flatMap((cp) => {
  const ch = String.fromCodePoint(cp);
  return [`${ch}'s`, ` ${ch}x`, `1${ch}2`];
});

export const CORPUS: string[] = [...HAND_PICKED, ...NEWER_UNICODE_STRINGS, ...randomStrings(120, 2026), LONG_PROMPT];
