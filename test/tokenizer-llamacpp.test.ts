// Our tokenizer against llama.cpp (through node-llama-cpp) on real vocabularies: every corpus
// string on every model, with and without special-token parsing, plus BOS handling,
// detokenization, and llama.cpp's own .inp/.out fixtures.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';
import type { Llama, LlamaModel, Token } from 'node-llama-cpp';
import { readHeader } from '../src/gguf/parse.ts';
import { loadTokenizer, Tokenizer } from '../src/model/tokenizer/index.ts';
import { Attr } from '../src/model/tokenizer/vocab.ts';
import { stories260K } from './support/models.ts';
import { CORPUS } from './tokenizer-corpus.ts';
import { gpt2VocabWithPre, vocabCases, vocabPath } from './tokenizer-fixtures.ts';

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
});
afterAll(async () => {
  await llama?.dispose();
});

/** node-llama-cpp's token attributes as llama.cpp attribute bits */
function attrBits(a: ReturnType<LlamaModel['getTokenAttributes']>): number {
  return (
    (a.unknown ? Attr.UNKNOWN : 0) | (a.unused ? Attr.UNUSED : 0) | (a.normal ? Attr.NORMAL : 0) | (a.control ? Attr.CONTROL : 0) |
    (a.userDefined ? Attr.USER_DEFINED : 0) | (a.byte ? Attr.BYTE : 0) | (a.lstrip ? Attr.LSTRIP : 0) | (a.rstrip ? Attr.RSTRIP : 0)
  );
}

interface Case {
  name: string;
  path: () => Promise<string>;
  /** llama.cpp's .inp/.out fixture name, where one exists */
  fixture?: string;
}

const CASES: Case[] = [
  { name: 'stories260K (llama/spm)', path: stories260K },
  { name: 'llama-spm', path: async () => vocabPath('llama-spm'), fixture: 'llama-spm' },
  { name: 'llama-bpe (Llama 3)', path: async () => vocabPath('llama-bpe'), fixture: 'llama-bpe' },
  { name: 'qwen2', path: async () => vocabPath('qwen2'), fixture: 'qwen2' },
  { name: 'qwen35 (Qwen3.5: letters take combining marks)', path: async () => vocabPath('qwen35'), fixture: 'qwen35' },
  { name: 'gpt-2', path: async () => vocabPath('gpt-2'), fixture: 'gpt-2' },
  { name: 'phi-3 (spm, rstrip specials)', path: async () => vocabPath('phi-3'), fixture: 'phi-3' },
  { name: 'mpt (gpt-2 regex)', path: async () => vocabPath('mpt'), fixture: 'mpt' },
  { name: 'gpt-2 merges, pre-tokenizer "default"', path: () => gpt2VocabWithPre('default') },
  { name: 'gpt-2 merges, pre-tokenizer "llama-bpe"', path: () => gpt2VocabWithPre('llama-bpe') },
];

for (const c of CASES) {
  describe(`tokenizer vs llama.cpp: ${c.name}`, () => {
    let ours: Tokenizer;
    let model: LlamaModel;
    beforeAll(async () => {
      const path = await c.path();
      ours = await loadTokenizer(path);
      model = await llama.loadModel({ modelPath: path, vocabOnly: true });
    });
    afterAll(async () => {
      await model?.dispose();
    });

    it(`encodes all ${CORPUS.length} corpus strings like model.tokenize(text, true)`, () => {
      const want = CORPUS.map((s) => Array.from(model.tokenize(s, true)));
      const got = CORPUS.map((s) => ours.encode(s, { addSpecial: false, parseSpecial: true }));
      const bad = CORPUS.filter((_, i) => JSON.stringify(got[i]) !== JSON.stringify(want[i]));
      expect(bad, `mismatched strings: ${JSON.stringify(bad.slice(0, 5))}`).toEqual([]);
    });

    it('encodes the corpus like model.tokenize(text, false) with special parsing off', () => {
      const want = CORPUS.map((s) => Array.from(model.tokenize(s, false)));
      const got = CORPUS.map((s) => ours.encode(s, { addSpecial: false, parseSpecial: false }));
      const bad = CORPUS.filter((_, i) => JSON.stringify(got[i]) !== JSON.stringify(want[i]));
      expect(bad, `mismatched strings: ${JSON.stringify(bad.slice(0, 5))}`).toEqual([]);
    });

    it('adds BOS/EOS as the model asks', () => {
      expect(ours.bos ?? null).toBe(model.tokens.bos);
      expect(ours.eos ?? null).toBe(model.tokens.eos);
      expect(ours.addsBos).toBe(model.tokens.shouldPrependBosToken);
      const text = 'Hello world';
      const body = Array.from(model.tokenize(text, true));
      const expected = [
        ...(model.tokens.shouldPrependBosToken ? [model.tokens.bos!] : []),
        ...body,
        ...(model.tokens.shouldAppendEosToken ? [model.tokens.eos!] : []),
      ];
      expect(ours.encode(text)).toEqual(expected);
      expect(ours.isEog(model.tokens.eos!)).toBe(true);
    });

    it('gives every token the attributes and end-of-generation flag llama.cpp gives it', () => {
      const differ: string[] = [];
      for (let id = 0; id < ours.size; id++) {
        const theirs = attrBits(model.getTokenAttributes(id as Token));
        if (theirs !== ours.vocab.attrs[id] || model.isEogToken(id as Token) !== ours.isEog(id)) differ.push(`${id} ${JSON.stringify(ours.tokenText(id))}`);
      }
      expect(differ.slice(0, 10), `${differ.length} tokens differ`).toEqual([]);
    });

    it('decodes the corpus tokens like model.detokenize (special off and on)', () => {
      const bad: string[] = [];
      for (const s of CORPUS) {
        const ids = ours.encode(s) as Token[];
        if (ours.decode(ids) !== model.detokenize(ids, false)) bad.push(s);
        if (ours.decode(ids, { special: true }) !== model.detokenize(ids, true)) bad.push(s);
      }
      expect(bad, `mismatched strings: ${JSON.stringify(bad.slice(0, 5))}`).toEqual([]);
    });

    it('round-trips decode(encode(x)) wherever llama.cpp does', () => {
      let roundTrips = 0;
      for (const s of CORPUS) {
        const ids = ours.encode(s, { addSpecial: false });
        const llamaRoundTrips = model.detokenize(Array.from(model.tokenize(s, true)), true) === s;
        if (llamaRoundTrips) {
          expect(ours.decode(ids, { special: true })).toBe(s);
          roundTrips++;
        }
      }
      expect(roundTrips).toBeGreaterThan(CORPUS.length / 2);
    });

    if (c.fixture) {
      it(`matches llama.cpp's ggml-vocab-${c.fixture} .inp/.out fixture`, () => {
        const cases = vocabCases(c.fixture!);
        expect(cases.length).toBeGreaterThan(30);
        for (const { text, ids } of cases) {
          expect(ours.encode(text, { addSpecial: false, parseSpecial: false }), JSON.stringify(text)).toEqual(ids);
        }
      });
    }
  });
}

// Vocabularies whose pre-tokenizer we do not run still show how llama.cpp finds FIM, EOT and
// end-of-generation tokens by their text; their attributes must come out the same.
describe('token attributes and end-of-generation ids on more of llama.cpp fixtures', () => {
  for (const name of ['command-r', 'deepseek-coder', 'refact', 'starcoder', 'qwen35', 'aquila', 'baichuan']) {
    it(`ggml-vocab-${name}`, async () => {
      const path = vocabPath(name);
      const meta = (await readHeader(path)).metadata;
      // the pre-tokenizer does not affect attributes; 'default' lets us read any gpt2 vocabulary
      const ours = Tokenizer.fromMetadata(meta['tokenizer.ggml.model'] === 'gpt2' ? { ...meta, 'tokenizer.ggml.pre': 'default' } : meta);
      const model = await llama.loadModel({ modelPath: path, vocabOnly: true });
      try {
        const differ: string[] = [];
        for (let id = 0; id < ours.size; id++) {
          if (attrBits(model.getTokenAttributes(id as Token)) !== ours.vocab.attrs[id] || model.isEogToken(id as Token) !== ours.isEog(id)) {
            differ.push(`${id} ${JSON.stringify(ours.tokenText(id))}`);
          }
        }
        expect(differ.slice(0, 10), `${differ.length} tokens differ`).toEqual([]);
      } finally {
        await model.dispose();
      }
    });
  }
});
