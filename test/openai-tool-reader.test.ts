// The tool-call reader on replies written the way real templates write an assistant's call
// (Qwen 2.5's <tool_call> tags, Llama 3.1–3.3's bare {"name", "parameters"}), rendered by the
// templates from llama.cpp's models/templates and fed token by token through the models' real
// vocabularies (qwen2, llama-bpe): what goes out while the reply is still coming, and that the
// pieces make up what a whole reply parses to.
import { readFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import { ChatTemplate } from '../src/model/chat-template.ts';
import type { ChatMessage } from '../src/model/chat-template.ts';
import { loadTokenizer } from '../src/model/tokenizer/index.ts';
import type { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { parseToolCalls, templateMessage, templateTools, TOOL_FORMATS, toolFormatOf, toolReader } from '../signaling-server/openai-tools.ts';
import type { ToolFormat, ToolSpec } from '../signaling-server/openai-tools.ts';
import type { ToolEvent } from '../signaling-server/tool-call-reader.ts';
import { templatePath, vocabPath } from './tokenizer-fixtures.ts';

const SPECS: ToolSpec[] = [
  { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { enum: ['c', 'f'] } } } },
  { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } } } },
];
const ARGS = '{"city": "Oslo", "unit": "c"}';
const HERMES = TOOL_FORMATS.find((f) => f.name === 'hermes')!;
const LLAMA = TOOL_FORMATS.find((f) => f.name === 'llama3-json')!;

const template = (name: string): ChatTemplate => new ChatTemplate(readFileSync(templatePath(name), 'utf8'), '', '');

/** The assistant turn a template renders for a call (with content before it), between its header and its end. */
function assistantTurn(name: string, head: string, end: string, content: string): string {
  const messages = [
    { role: 'user', content: 'What is the weather in Oslo?' },
    templateMessage({ role: 'assistant', content, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: ARGS } }] }),
  ] as unknown as ChatMessage[];
  const text = template(name).render(messages, { addGenerationPrompt: false, variables: { tools: templateTools(SPECS) } });
  const from = text.lastIndexOf(head) + head.length;
  return text.slice(from, text.indexOf(end, from));
}

/** Feeds the reply one token's text at a time; each event with the number of the piece it came out at. */
function feed(format: ToolFormat, pieces: readonly string[], forced = false) {
  const reader = toolReader(format, SPECS, forced);
  const events: (ToolEvent & { at: number })[] = [];
  pieces.forEach((p, at) => events.push(...reader.push(p).map((e) => ({ ...e, at }))));
  events.push(...reader.end().map((e) => ({ ...e, at: pieces.length })));
  const text = (kind: ToolEvent['kind']) => events.map((e) => (e.kind === kind && 'text' in e ? e.text : '')).join('');
  return { reader, events, content: text('content'), args: text('arguments') };
}

const tokenPieces = (tok: Tokenizer, text: string): string[] => tok.encode(text, { addSpecial: false }).map((id) => tok.decode([id], { special: true }));

describe('tool-call reader', () => {
  let qwen: Tokenizer;
  let llama3: Tokenizer;
  beforeAll(async () => {
    qwen = await loadTokenizer(vocabPath('qwen2'));
    llama3 = await loadTokenizer(vocabPath('llama-bpe'));
  });

  it('Hermes/Qwen: content before a call goes out before the call starts, then the call, then its arguments piece by piece', () => {
    const reply = assistantTurn('Qwen-Qwen2.5-7B-Instruct', '<|im_start|>assistant\n', '<|im_end|>', 'Let me check.');
    expect(reply).toBe(`Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": ${ARGS}}\n</tool_call>`);
    const pieces = tokenPieces(qwen, reply);
    // the piece in which the tag begins
    let tag = 0;
    for (let at = 0; at + pieces[tag]!.length <= reply.indexOf('<tool_call>'); tag++) at += pieces[tag]!.length;
    expect(tag).toBeGreaterThan(3);
    const { reader, events, content, args } = feed(HERMES, pieces);
    expect(content).toBe('Let me check.');
    // every content character is out before the tag begins
    expect(events.filter((e) => e.kind === 'content').every((e) => e.at < tag)).toBe(true);
    const call = events.find((e) => e.kind === 'call')!;
    expect(call).toMatchObject({ index: 0, name: 'get_weather' });
    const argEvents = events.filter((e) => e.kind === 'arguments');
    expect(argEvents.length).toBeGreaterThan(3);
    expect(argEvents[0]!.at).toBeLessThan(pieces.length - 3); // out while the call is still being written
    expect(args).toBe(ARGS);
    // the whole reply parses to the same call and content
    const whole = parseToolCalls(reply, SPECS, false, HERMES);
    expect(whole.content).toBe('Let me check.');
    expect(whole.calls.map((c) => c.function)).toEqual([{ name: 'get_weather', arguments: ARGS }]);
    expect(reader.result()).toEqual({ content: 'Let me check.', calls: [{ id: (call as { id: string }).id, type: 'function', function: { name: 'get_weather', arguments: ARGS } }] });
  });

  it('Llama 3.1/3.2/3.3: the reply that is a {"name", "parameters"} object is a call; its parameters stream as the arguments', () => {
    for (const name of ['meta-llama-Llama-3.1-8B-Instruct', 'meta-llama-Llama-3.2-3B-Instruct', 'meta-llama-Llama-3.3-70B-Instruct']) {
      expect(toolFormatOf(template(name)).name).toBe('llama3-json');
      const reply = assistantTurn(name, '<|start_header_id|>assistant<|end_header_id|>\n\n', '<|eot_id|>', '');
      expect(reply).toBe(`{"name": "get_weather", "parameters": ${ARGS}}`);
      const { events, content, args, reader } = feed(LLAMA, tokenPieces(llama3, reply));
      expect(content).toBe('');
      expect(events[0]).toMatchObject({ kind: 'call', index: 0, name: 'get_weather' });
      expect(events.filter((e) => e.kind === 'arguments').length).toBeGreaterThan(3);
      expect(args).toBe(ARGS);
      expect(reader.result().content).toBeNull();
      expect(parseToolCalls(reply, SPECS, false, LLAMA).calls.map((c) => c.function)).toEqual([{ name: 'get_weather', arguments: ARGS }]);
    }
    // a plain answer streams as content from its first token
    const plain = tokenPieces(llama3, 'It is sunny in Oslo.');
    const { events, content } = feed(LLAMA, plain);
    expect(content).toBe('It is sunny in Oslo.');
    expect(events[0]).toMatchObject({ kind: 'content', at: 0 });
    // JSON that is no call stays content
    expect(parseToolCalls('{"city": "Oslo"}', SPECS, false, LLAMA)).toEqual({ content: '{"city": "Oslo"}', calls: [] });
  });

  it('split anywhere, a reply reads the same: content, calls and arguments', () => {
    const reply = 'Checking two things.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "x\\"}"}]}}\n</tool_call>\n<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>\nDone.';
    const whole = parseToolCalls(reply, SPECS, false, HERMES);
    expect(whole.content).toBe('Checking two things.\nDone.');
    expect(whole.calls.map((c) => c.function)).toEqual([
      { name: 'add', arguments: '{"a": 1, "b": [2, {"c": "x\\"}"}]}' },
      { name: 'get_weather', arguments: '{"city": "Oslo"}' },
    ]);
    for (let i = 1; i < reply.length; i++) {
      const { content, reader } = feed(HERMES, [reply.slice(0, i), reply.slice(i)]);
      expect(content, `split at ${i}`).toBe(whole.content);
      expect(reader.calls.map((c) => c.function), `split at ${i}`).toEqual(whole.calls.map((c) => c.function));
    }
    const chars = feed(HERMES, [...reply]);
    expect(chars.events.filter((e) => e.kind === 'call').map((e) => (e as { index: number }).index)).toEqual([0, 1]);
  });

  it('a forced call (the whole reply is the call JSON, as xgrammar writes it) streams the same way', () => {
    for (const format of [HERMES, LLAMA]) {
      const reply = `{"name":"add","${format.argsKey}":{"a":12,"b":7}}`;
      const { events, args, reader } = feed(format, [...reply], true);
      expect(events[0]).toMatchObject({ kind: 'call', name: 'add', at: reply.indexOf('{', 1) });
      expect(args).toBe('{"a":12,"b":7}');
      expect(reader.result()).toMatchObject({ content: null, calls: [{ function: { name: 'add', arguments: '{"a":12,"b":7}' } }] });
    }
  });

  it('malformed calls: stay content when found before the call went out; broken or cut after, the reader says so and a whole reply keeps the text', () => {
    // an unknown tool, or not JSON: text, streamed and whole alike
    for (const reply of ['<tool_call>{"name": "rm", "arguments": {}}</tool_call>', '<tool_call>nope</tool_call>']) {
      const { content, events } = feed(HERMES, [...reply]);
      expect(content).toBe(reply);
      expect(events.some((e) => e.kind === 'call')).toBe(false);
      expect(parseToolCalls(reply, SPECS, false, HERMES)).toEqual({ content: reply, calls: [] });
    }
    // arguments that are not an object: no call
    expect(parseToolCalls('{"name": "add", "parameters": 3}', SPECS, false, LLAMA).calls).toEqual([]);
    // broken after the call went out
    const broken = 'A <tool_call>{"name": "add", "arguments": {"a": 1,, }}</tool_call> B';
    const b = feed(HERMES, [...broken]);
    expect(b.events.some((e) => e.kind === 'call')).toBe(true);
    expect(b.reader.broken).toMatch(/call to add broke off/);
    expect(b.reader.result()).toEqual({ content: 'A<tool_call>{"name": "add", "arguments": {"a": 1,, }}</tool_call> B', calls: [] });
    // cut short (max_tokens) after the call went out
    const cut = feed(LLAMA, [...'{"name": "add", "parameters": {"a": 1'], true);
    expect(cut.reader.cut).toBe(true);
    expect(cut.reader.result()).toEqual({ content: '{"name": "add", "parameters": {"a": 1', calls: [] });
  });

  it("a template in neither format is refused by name (Mistral's [TOOL_CALLS])", () => {
    expect(toolFormatOf(template('Qwen-Qwen2.5-7B-Instruct')).name).toBe('hermes');
    expect(toolFormatOf(template('NousResearch-Hermes-3-Llama-3.1-8B-tool_use')).name).toBe('hermes');
    expect(() => toolFormatOf(template('mistralai-Mistral-Nemo-Instruct-2407'))).toThrow(expect.objectContaining({ code: 'BAD_REQUEST', details: expect.objectContaining({ param: 'tools' }) }));
  });
});
