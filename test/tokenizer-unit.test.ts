// Tokenizer behaviour that needs no oracle run: streaming decode across byte tokens, errors
// that name what is unsupported, end-of-generation ids, and speed on a 4 KB prompt.
import { beforeAll, describe, expect, it } from 'vitest';
import { readHeader } from '../src/gguf/parse.ts';
import type { MetadataValue } from '../src/gguf/types.ts';
import { loadTokenizer, StreamingDecoder, Tokenizer } from '../src/model/tokenizer/index.ts';
import { stories260K } from './support/models.ts';
import { LONG_PROMPT } from './tokenizer-corpus.ts';
import { vocabPath } from './tokenizer-fixtures.ts';

let stories: Tokenizer;
let storiesMeta: Record<string, MetadataValue>;
beforeAll(async () => {
  storiesMeta = (await readHeader(await stories260K())).metadata;
  stories = Tokenizer.fromMetadata(storiesMeta);
});

describe('StreamingDecoder', () => {
  it('emits only whole characters when a character spans several byte tokens', () => {
    const text = 'Lily 日本 🦙 done';
    const ids = stories.encode(text);
    // stories260K spells CJK and emoji with <0xNN> byte tokens
    const byteIds = ids.filter((id) => /^<0x[0-9A-F]{2}>$/.test(stories.tokenText(id)));
    expect(byteIds.length).toBeGreaterThanOrEqual(10);
    const stream = new StreamingDecoder(stories);
    const deltas = ids.map((id) => stream.push(id));
    deltas.push(stream.flush());
    expect(deltas.join('')).toBe(' ' + text); // the SentencePiece space prefix stays in a stream
    expect(deltas.join('')).toBe(stories.decode(ids));
    expect(deltas.some((d) => d.includes('\ufffd'))).toBe(false);
    // the first byte of 日 (3 bytes) gives nothing, its last byte gives the whole character
    const first = ids.findIndex((id) => stories.tokenText(id) === '<0xE6>');
    expect(deltas[first]).toBe('');
    expect(deltas[first + 1]).toBe('');
    expect(deltas[first + 2]).toBe('日');
  });

  it('flushes an unfinished character as U+FFFD and hides control tokens unless asked', () => {
    const e6 = stories.encode('<0xE6>', { addSpecial: false }); // text, not the byte token
    expect(e6.length).toBeGreaterThan(1);
    const byteE6 = stories.vocab.ids.get('<0xE6>')!;
    const stream = new StreamingDecoder(stories);
    expect(stream.push(1)).toBe('');
    expect(stream.push(byteE6)).toBe('');
    expect(stream.flush()).toBe('\ufffd');
    const special = new StreamingDecoder(stories, { special: true });
    expect(special.push(1)).toBe('<s>');
  });

  it('gives the bytes of one token through tokenPiece', () => {
    expect(Array.from(stories.tokenPiece(stories.vocab.ids.get('<0x41>')!))).toEqual([0x41]);
    expect(new TextDecoder().decode(stories.tokenPiece(403))).toBe(' Once');
    expect(stories.tokenPiece(1)).toHaveLength(0);
    expect(new TextDecoder().decode(stories.tokenPiece(1, { special: true }))).toBe('<s>');
  });
});

describe('special tokens and BOS/EOS', () => {
  it('adds BOS only when asked and gives [BOS] for empty text', () => {
    expect(stories.encode('')).toEqual([1]);
    expect(stories.encode('', { addSpecial: false })).toEqual([]);
    expect(stories.encode('Once upon a time')).toEqual([1, 403, 407, 261, 378]);
  });

  it('parses control-token text only with parseSpecial', () => {
    expect(stories.encode('a</s>b', { addSpecial: false })).toContain(2);
    expect(stories.encode('a</s>b', { addSpecial: false, parseSpecial: false })).not.toContain(2);
  });

  it('knows the end-of-generation tokens', async () => {
    expect(stories.isEog(2)).toBe(true);
    expect(stories.isEog(1)).toBe(false);
    const llama3 = await loadTokenizer(vocabPath('llama-bpe'));
    const eot = llama3.encode('<|eot_id|>', { addSpecial: false });
    expect(eot).toHaveLength(1);
    expect(llama3.isEog(eot[0]!)).toBe(true);
    expect(llama3.isEog(llama3.eos!)).toBe(true);
    expect(llama3.isEog(llama3.bos!)).toBe(false);
  });
});

describe('errors name what is unsupported', () => {
  const gpt2 = (extra: Record<string, MetadataValue>): Record<string, MetadataValue> => ({
    'tokenizer.ggml.model': 'gpt2',
    'tokenizer.ggml.tokens': ['a', 'b', 'ab'],
    'tokenizer.ggml.merges': ['a b'],
    ...extra,
  });

  it('rejects an unknown tokenizer model', () => {
    expect(() => Tokenizer.fromMetadata({ ...storiesMeta, 'tokenizer.ggml.model': 'bert' })).toThrow(
      expect.objectContaining({ code: 'TOKENIZER_UNSUPPORTED_MODEL', message: expect.stringContaining("'bert'") }),
    );
  });

  it('rejects an unknown pre-tokenizer', () => {
    expect(() => Tokenizer.fromMetadata(gpt2({ 'tokenizer.ggml.pre': 'deepseek-llm' }))).toThrow(
      expect.objectContaining({ code: 'TOKENIZER_UNSUPPORTED_PRE', message: expect.stringContaining("'deepseek-llm'") }),
    );
  });

  it('reports missing tokens, merges and tokenizer metadata', () => {
    expect(() => Tokenizer.fromMetadata({})).toThrow(expect.objectContaining({ code: 'TOKENIZER_MISSING' }));
    expect(() => Tokenizer.fromMetadata({ 'tokenizer.ggml.model': 'llama' })).toThrow(expect.objectContaining({ code: 'TOKENIZER_MISSING_VOCAB' }));
    const noMerges = gpt2({});
    delete noMerges['tokenizer.ggml.merges'];
    expect(() => Tokenizer.fromMetadata(noMerges)).toThrow(expect.objectContaining({ code: 'TOKENIZER_MISSING_MERGES' }));
  });

  it('merges a tiny gpt2 vocabulary with the default pre-tokenizer', () => {
    const t = Tokenizer.fromMetadata(gpt2({}));
    expect(t.encode('ab', { addSpecial: false })).toEqual([2]);
    expect(t.decode([2, 0])).toBe('aba');
  });

  it('rejects ids outside the vocabulary', () => {
    expect(() => stories.decode([1, 512])).toThrow(expect.objectContaining({ code: 'TOKEN_OUT_OF_RANGE' }));
    expect(() => stories.tokenPiece(-1)).toThrow(expect.objectContaining({ code: 'TOKEN_OUT_OF_RANGE' }));
  });
});

describe('speed', () => {
  it('encodes a 4 KB prompt in milliseconds on every vocabulary kind', async () => {
    const prompt = LONG_PROMPT.slice(0, 4096);
    const timings: Record<string, number> = {};
    for (const [name, tok] of [
      ['stories260K', stories],
      ['llama-bpe', await loadTokenizer(vocabPath('llama-bpe'))],
      ['qwen2', await loadTokenizer(vocabPath('qwen2'))],
    ] as const) {
      const t0 = performance.now();
      const ids = tok.encode(prompt);
      timings[name] = performance.now() - t0;
      expect(ids.length).toBeGreaterThan(500);
    }
    console.log('4 KB prompt encode (ms, cold):', JSON.stringify(timings, (_, v: unknown) => (typeof v === 'number' ? Math.round(v * 10) / 10 : v)));
    // generous bound for a shared 2-core machine; typical values are a few ms
    for (const ms of Object.values(timings)) expect(ms).toBeLessThan(250);
  });
});
