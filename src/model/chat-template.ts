// Chat prompts from a model's own template: `tokenizer.chat_template` (Jinja, as shipped on
// the Hugging Face hub) rendered with @huggingface/jinja, given the messages, whether to open
// an assistant turn, and the model's BOS/EOS texts.
//
// A model without a template is an error (MeshError CHAT_TEMPLATE_MISSING) unless the caller
// opts into the fallback: ChatML, the format llama.cpp also falls back to —
//   <|im_start|>{role}\n{content}<|im_end|>\n   for each message, then
//   <|im_start|>assistant\n                       when a generation prompt is asked for.

import { Template } from '@huggingface/jinja';
import { MeshError } from '../errors.ts';
import type { MetadataValue } from '../gguf/types.ts';
import type { Tokenizer } from './tokenizer/index.ts';

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | (string & {});
  content: string;
}

export interface ChatRenderOptions {
  /** end with the opening of an assistant turn (default true) */
  addGenerationPrompt?: boolean;
  /** further template variables (e.g. tools, date_string) */
  variables?: Record<string, unknown>;
}

/** ChatML: what a model without a template gets when the caller accepts the fallback. */
export const FALLBACK_CHAT_TEMPLATE =
  "{%- for message in messages -%}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}" +
  '{%- endfor -%}' +
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

export class ChatTemplate {
  private readonly template: Template;

  /**
   * @param source Jinja source
   * @param bosToken text bound to `bos_token`
   * @param eosToken text bound to `eos_token`
   * @param isFallback true when the model had no template of its own
   */
  constructor(
    readonly source: string,
    readonly bosToken = '',
    readonly eosToken = '',
    readonly isFallback = false,
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new MeshError('CHAT_TEMPLATE_INVALID', `the chat template does not parse: ${(e as Error).message}`);
    }
  }

  /**
   * The template of a model, from its metadata. BOS/EOS texts come from the tokenizer when
   * one is given. Without `tokenizer.chat_template` this throws CHAT_TEMPLATE_MISSING, unless
   * `fallback` is set, which selects FALLBACK_CHAT_TEMPLATE (ChatML).
   */
  static fromMetadata(
    metadata: Record<string, MetadataValue>,
    { tokenizer, fallback = false }: { tokenizer?: Tokenizer; fallback?: boolean } = {},
  ): ChatTemplate {
    const source = metadata['tokenizer.chat_template'];
    const bos = tokenizer?.bos !== undefined ? tokenizer.tokenText(tokenizer.bos) : '';
    const eos = tokenizer?.eos !== undefined ? tokenizer.tokenText(tokenizer.eos) : '';
    if (typeof source === 'string' && source.trim() !== '') return new ChatTemplate(source, bos, eos);
    if (!fallback) {
      throw new MeshError(
        'CHAT_TEMPLATE_MISSING',
        'the model has no chat template (tokenizer.chat_template); pass a template or accept the ChatML fallback',
      );
    }
    return new ChatTemplate(FALLBACK_CHAT_TEMPLATE, bos, eos, true);
  }

  /**
   * The prompt text to pass to `tokenizer.encode(text)` (special tokens added and parsed):
   * like render(), minus a leading BOS text when the tokenizer adds BOS itself and a trailing
   * EOS text when it adds EOS, as llama.cpp's chat code does — so BOS is not doubled.
   */
  prompt(tokenizer: Tokenizer, messages: readonly ChatMessage[], options: ChatRenderOptions = {}): string {
    let text = this.render(messages, options);
    if (tokenizer.addsBos && this.bosToken !== '' && text.startsWith(this.bosToken)) text = text.slice(this.bosToken.length);
    if (tokenizer.addsEos && this.eosToken !== '' && text.endsWith(this.eosToken)) text = text.slice(0, -this.eosToken.length);
    return text;
  }

  render(messages: readonly ChatMessage[], { addGenerationPrompt = true, variables = {} }: ChatRenderOptions = {}): string {
    try {
      return this.template.render({
        ...variables,
        messages: messages.map((m) => ({ ...m })),
        add_generation_prompt: addGenerationPrompt,
        bos_token: this.bosToken,
        eos_token: this.eosToken,
      });
    } catch (e) {
      throw new MeshError('CHAT_TEMPLATE_RENDER', `the chat template failed to render: ${(e as Error).message}`);
    }
  }
}
