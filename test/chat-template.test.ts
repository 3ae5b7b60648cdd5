// Chat templates rendered from real templates (llama.cpp's models/templates/*.jinja and the
// qwen2 vocabulary's own tokenizer.chat_template), checked against strings derived by hand
// from reading each template.
import { readFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import { readHeader } from '../src/gguf/parse.ts';
import { ChatTemplate, FALLBACK_CHAT_TEMPLATE } from '../src/model/chat-template.ts';
import type { ChatMessage } from '../src/model/chat-template.ts';
import { loadTokenizer, Tokenizer } from '../src/model/tokenizer/index.ts';
import { stories260K } from './support/models.ts';
import { templatePath, vocabPath } from './tokenizer-fixtures.ts';

const SYSTEM_USER: ChatMessage[] = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Hello!' },
];
const USER_ASSISTANT: ChatMessage[] = [
  { role: 'user', content: 'Hello!' },
  { role: 'assistant', content: 'Hi there.' },
];

function fileTemplate(name: string, bos: string, eos: string): ChatTemplate {
  return new ChatTemplate(readFileSync(templatePath(name), 'utf8'), bos, eos);
}

describe('chat templates from llama.cpp models/templates', () => {
  it('Llama 3.1: system + user with a generation prompt', () => {
    const t = fileTemplate('meta-llama-Llama-3.1-8B-Instruct', '<|begin_of_text|>', '<|eot_id|>');
    expect(t.render(SYSTEM_USER)).toBe(
      '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n' +
        'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' +
        'You are terse.<|eot_id|>' +
        '<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>' +
        '<|start_header_id|>assistant<|end_header_id|>\n\n',
    );
  });

  it('Llama 3.1: user + assistant without a generation prompt (empty system block)', () => {
    const t = fileTemplate('meta-llama-Llama-3.1-8B-Instruct', '<|begin_of_text|>', '<|eot_id|>');
    expect(t.render(USER_ASSISTANT, { addGenerationPrompt: false })).toBe(
      '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n' +
        'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>' +
        '<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>' +
        '<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>',
    );
  });

  it('Qwen2.5 (ChatML with a default system message)', () => {
    const t = fileTemplate('Qwen-Qwen2.5-7B-Instruct', '', '<|im_end|>');
    expect(t.render(USER_ASSISTANT, { addGenerationPrompt: false })).toBe(
      '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' +
        '<|im_start|>user\nHello!<|im_end|>\n' +
        '<|im_start|>assistant\nHi there.<|im_end|>\n',
    );
    expect(t.render(SYSTEM_USER)).toBe(
      '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n',
    );
  });

  it('Mistral Nemo: [INST] blocks, EOS after the assistant, system folded into the last user turn', () => {
    const t = fileTemplate('mistralai-Mistral-Nemo-Instruct-2407', '<s>', '</s>');
    expect(t.render(USER_ASSISTANT, { addGenerationPrompt: false })).toBe('<s>[INST]Hello![/INST]Hi there.</s>');
    expect(t.render(SYSTEM_USER)).toBe('<s>[INST]You are terse.\n\nHello![/INST]');
  });

  it("turns the template's raise_exception into CHAT_TEMPLATE_RENDER", () => {
    const t = fileTemplate('mistralai-Mistral-Nemo-Instruct-2407', '<s>', '</s>');
    const bad: ChatMessage[] = [
      { role: 'user', content: 'a' },
      { role: 'user', content: 'b' },
    ];
    expect(() => t.render(bad)).toThrow(expect.objectContaining({ code: 'CHAT_TEMPLATE_RENDER' }));
  });

  it('rejects a template that does not parse with CHAT_TEMPLATE_INVALID', () => {
    expect(() => new ChatTemplate('{% for m in messages %}')).toThrow(expect.objectContaining({ code: 'CHAT_TEMPLATE_INVALID' }));
  });
});

describe('chat templates from model metadata', () => {
  let qwenMeta: Awaited<ReturnType<typeof readHeader>>['metadata'];
  let qwen: Tokenizer;
  beforeAll(async () => {
    qwenMeta = (await readHeader(vocabPath('qwen2'))).metadata;
    qwen = Tokenizer.fromMetadata(qwenMeta);
  });

  it("renders the qwen2 vocabulary's own template and tokenizes its control tokens", () => {
    const t = ChatTemplate.fromMetadata(qwenMeta, { tokenizer: qwen });
    expect(t.isFallback).toBe(false);
    const text = t.prompt(qwen, USER_ASSISTANT.slice(0, 1));
    expect(text).toBe('<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n');
    const ids = qwen.encode(text);
    const imStart = qwen.encode('<|im_start|>', { addSpecial: false });
    expect(imStart).toHaveLength(1);
    expect(ids.filter((id) => id === imStart[0])).toHaveLength(3);
  });

  it('prompt() drops the BOS text when the tokenizer adds BOS itself (Llama 3)', async () => {
    const llama3 = await loadTokenizer(vocabPath('llama-bpe'));
    const t = new ChatTemplate(readFileSync(templatePath('meta-llama-Llama-3.1-8B-Instruct'), 'utf8'), '<|begin_of_text|>', '<|eot_id|>');
    const ids = llama3.encode(t.prompt(llama3, SYSTEM_USER));
    expect(ids[0]).toBe(llama3.bos);
    expect(ids.filter((id) => id === llama3.bos)).toHaveLength(1);
  });

  it('names a missing template with CHAT_TEMPLATE_MISSING and falls back to ChatML on request', async () => {
    const meta = (await readHeader(await stories260K())).metadata;
    const tok = Tokenizer.fromMetadata(meta);
    expect(() => ChatTemplate.fromMetadata(meta, { tokenizer: tok })).toThrow(expect.objectContaining({ code: 'CHAT_TEMPLATE_MISSING' }));
    const t = ChatTemplate.fromMetadata(meta, { tokenizer: tok, fallback: true });
    expect(t.isFallback).toBe(true);
    expect(t.source).toBe(FALLBACK_CHAT_TEMPLATE);
    expect(t.bosToken).toBe('<s>');
    expect(t.render(USER_ASSISTANT)).toBe('<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n<|im_start|>assistant\n');
  });
});
