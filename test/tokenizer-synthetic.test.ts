// The synthetic vocabularies make-model writes (src/model/synthetic-vocab.ts) through our
// tokenizer and through llama.cpp: every corpus string must tokenize and detokenize alike.
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';
import type { Llama, LlamaModel, Token } from 'node-llama-cpp';
import { readHeader } from '../src/gguf/parse.ts';
import { buildVocab } from '../src/model/synthetic-vocab.ts';
import type { VocabOptions } from '../src/model/synthetic-vocab.ts';
import { ChatTemplate } from '../src/model/chat-template.ts';
import { Tokenizer } from '../src/model/tokenizer/index.ts';
import { REPO_ROOT } from './support/cli.ts';
import { CORPUS } from './tokenizer-corpus.ts';
import { writeVocabOnlyGguf } from './tokenizer-fixtures.ts';

/** A vocabulary-only GGUF holding one synthetic tokenizer; llama.cpp loads it with vocabOnly. */
function writeVocabOnly(opts: VocabOptions): Promise<string> {
  // buildVocab is deterministic: a file named by its content is reused across runs
  const vocab = buildVocab(opts);
  const digest = createHash('sha256').update(JSON.stringify(vocab.metadata, (_, v: unknown) => (ArrayBuffer.isView(v) ? Array.from(v as Float32Array) : v))).digest('hex');
  const path = join(REPO_ROOT, '.cache', 'tokenizer', `synthetic-${opts.kind}-${opts.pre ?? 'spm'}-${opts.vocabSize}-${digest.slice(0, 12)}.gguf`);
  return writeVocabOnlyGguf(path, 'llama', 'synthetic vocabulary', vocab.metadata);
}

const CONFIGS: VocabOptions[] = [
  { kind: 'llama', vocabSize: 600 },
  { kind: 'llama', vocabSize: 4000 },
  { kind: 'gpt2', vocabSize: 1000, pre: 'llama-bpe' },
  { kind: 'gpt2', vocabSize: 1000, pre: 'qwen2' },
  { kind: 'gpt2', vocabSize: 3000, pre: 'gpt-2' },
];

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
});
afterAll(async () => {
  await llama?.dispose();
});

for (const opts of CONFIGS) {
  describe(`synthetic ${opts.kind} vocabulary (${opts.pre ?? 'sentencepiece'}, ${opts.vocabSize} tokens) vs llama.cpp`, () => {
    let ours: Tokenizer;
    let metadata: Awaited<ReturnType<typeof readHeader>>['metadata'];
    let model: LlamaModel;
    beforeAll(async () => {
      const path = await writeVocabOnly(opts);
      metadata = (await readHeader(path)).metadata;
      ours = Tokenizer.fromMetadata(metadata);
      model = await llama.loadModel({ modelPath: path, vocabOnly: true });
    });
    afterAll(async () => {
      await model?.dispose();
    });

    it(`encodes all ${CORPUS.length} corpus strings alike, specials parsed or not`, () => {
      for (const parseSpecial of [true, false]) {
        const bad = CORPUS.filter(
          (s) => JSON.stringify(ours.encode(s, { addSpecial: false, parseSpecial })) !== JSON.stringify(Array.from(model.tokenize(s, parseSpecial))),
        );
        expect(bad, `parseSpecial=${parseSpecial}: ${JSON.stringify(bad.slice(0, 5))}`).toEqual([]);
      }
      expect(ours.addsBos).toBe(model.tokens.shouldPrependBosToken);
    });

    it('decodes alike', () => {
      const bad = CORPUS.filter((s) => {
        const ids = ours.encode(s) as Token[];
        return ours.decode(ids) !== model.detokenize(ids, false) || ours.decode(ids, { special: true }) !== model.detokenize(ids, true);
      });
      expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
    });

    it('renders its ChatML template into prompts whose control tokens are single tokens', () => {
      const t = ChatTemplate.fromMetadata(metadata, { tokenizer: ours });
      const text = t.prompt(ours, [{ role: 'user', content: 'Hello!' }]);
      expect(text).toBe('<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n');
      const ids = ours.encode(text);
      expect(ids).toEqual([...(ours.addsBos ? [ours.bos!] : []), ...Array.from(model.tokenize(text, true))]);
      expect(ids).toContain(ours.vocab.ids.get('<|im_start|>'));
    });
  });
}
