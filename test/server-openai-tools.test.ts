// Tool calling through the model's own chat template (Qwen 2.5's, from llama.cpp's
// models/templates, on a small synthetic llama with its ChatML tokens): tools rendered by the
// template, a forced call (tool_choice "required" or named) constrained to the tools' schemas
// and returned as tool_calls (streamed as OpenAI streams them: the call named, then its arguments
// piece by piece, making up the non-streamed call of the same seed), and the round trip — the assistant's call
// and a `role: tool` result rendered back into the next prompt. The official `openai` client
// against `serve` + one node.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type OpenAI from 'openai';
import { parseToolCalls } from '../signaling-server/openai-tools.ts';
import { expectAutoStreamsAsWhole, roundTrip, WEATHER_TOOL, serveWithTemplate, specsOf, streamed as streamedOn } from './support/tool-serve.ts';
import type { ToolServe } from './support/tool-serve.ts';

let t: ToolServe;
let openai: OpenAI;
let model: string;
let serve: ToolServe['serve'];

const TOOLS: OpenAI.ChatCompletionTool[] = [
  WEATHER_TOOL,
  {
    type: 'function',
    function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 999 }, b: { type: 'integer', minimum: 0, maximum: 999 } }, required: ['a', 'b'], additionalProperties: false } },
  },
];
const SPECS = specsOf(TOOLS);

beforeAll(async () => {
  t = await serveWithTemplate('Qwen-Qwen2.5-7B-Instruct', 5);
  ({ openai, model, serve } = t);
});

afterAll(() => t.close());

const streamed = (body: OpenAI.ChatCompletionCreateParamsStreaming) => streamedOn(openai, body);

describe('tools', () => {
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is the weather in Paris?' }];

  it('tool_choice "required": a call to one of the tools whose arguments match its schema, for every seed', async () => {
    for (let seed = 1; seed <= 4; seed++) {
      const r = await openai.chat.completions.create({ model, messages, tools: TOOLS, tool_choice: 'required', temperature: 1, seed, max_tokens: 300 });
      const c = r.choices[0]!;
      expect(c.finish_reason, JSON.stringify(c.message)).toBe('tool_calls');
      expect(c.message.content).toBeNull();
      const call = c.message.tool_calls![0]!;
      expect(call.id).toMatch(/^call_/);
      const args = JSON.parse(call.function.arguments);
      if (call.function.name === 'get_weather') {
        expect(typeof args.city === 'string' && args.city.length <= 12).toBe(true);
        expect(['c', 'f']).toContain(args.unit);
      } else {
        expect(call.function.name).toBe('add');
        expect(Number.isInteger(args.a) && Number.isInteger(args.b)).toBe(true);
      }
    }
  });

  it('a named tool_choice calls that tool; streamed, the call arrives as a tool_calls delta', async () => {
    const choice = { type: 'function' as const, function: { name: 'add' } };
    const r = await openai.chat.completions.create({ model, messages, tools: TOOLS, tool_choice: choice, temperature: 0, max_tokens: 300 });
    expect(r.choices[0]!.message.tool_calls![0]!.function.name).toBe('add');
    const stream = await openai.chat.completions.create({ model, messages, tools: TOOLS, tool_choice: choice, temperature: 0, max_tokens: 300, stream: true });
    let name = '';
    let args = '';
    let finish: string | null = null;
    for await (const c of stream) {
      for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
        name += d.function?.name ?? '';
        args += d.function?.arguments ?? '';
      }
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(name).toBe('add');
    expect(args).toBe(r.choices[0]!.message.tool_calls![0]!.function.arguments);
    expect(finish).toBe('tool_calls');
  });

  it('streamed, tool_choice "required": a first delta naming the call, then argument pieces that make up the non-streamed call of the same seed', async () => {
    for (let seed = 1; seed <= 3; seed++) {
      const body = { model, messages, tools: TOOLS, tool_choice: 'required' as const, temperature: 1, seed, max_tokens: 300 };
      const whole = (await openai.chat.completions.create(body)).choices[0]!;
      const call = whole.message.tool_calls![0]!;
      const { deltas, finish, content } = await streamed({ ...body, stream: true });
      expect(deltas[0]).toMatchObject({ index: 0, type: 'function', function: { name: call.function.name, arguments: '' } });
      expect(deltas[0]!.id).toMatch(/^call_/);
      const pieces = deltas.slice(1);
      expect(pieces.length, `seed ${seed}`).toBeGreaterThan(2); // generated piece by piece, not one delta at the end
      expect(pieces.every((d) => d.index === 0 && d.id === undefined && d.function?.name === undefined)).toBe(true);
      expect(pieces.map((d) => d.function?.arguments ?? '').join('')).toBe(call.function.arguments);
      expect(finish).toBe('tool_calls');
      expect(content).toBe('');
    }
  });

  it('a forced call cut by max_tokens: whole, the text with finish_reason "length"; streamed, the call so far with "length"', async () => {
    const body = { model, messages, tools: TOOLS, tool_choice: { type: 'function' as const, function: { name: 'get_weather' } }, temperature: 1, seed: 3, max_tokens: 300 };
    const full = await openai.chat.completions.create(body);
    const cutAt = full.usage!.completion_tokens - 2; // inside the arguments' closing
    const cut = (await openai.chat.completions.create({ ...body, max_tokens: cutAt })).choices[0]!;
    expect(cut.finish_reason).toBe('length');
    expect(cut.message.tool_calls ?? []).toEqual([]);
    expect(cut.message.content).toMatch(/^\{\s*"name":\s*"get_weather",\s*"arguments":\s*\{/);
    const { deltas, finish } = await streamed({ ...body, max_tokens: cutAt, stream: true });
    expect(finish).toBe('length');
    expect(deltas[0]).toMatchObject({ function: { name: 'get_weather' } });
    expect(full.choices[0]!.message.tool_calls![0]!.function.arguments.startsWith(deltas.map((d) => d.function?.arguments ?? '').join(''))).toBe(true);
  });

  it('"auto": the text the model writes streams as it comes and reads the same as the whole reply of the same seed', () =>
    expectAutoStreamsAsWhole(t, { model, messages, tools: TOOLS, temperature: 1, max_tokens: 24 }));

  it('round trip: the call and a role "tool" result are rendered back through the template into the next prompt', async () => {
    // the server's prompt is the template's rendering of the call and the result
    const { rendered, call } = await roundTrip(t, messages, TOOLS, 'get_weather');
    expect(rendered).toContain('<tool_response>\n{"temp": 18}\n</tool_response>');
    const rendered_call = /<tool_call>\n\{"name": "get_weather", "arguments": (.*)\}\n<\/tool_call>/.exec(rendered);
    expect(rendered_call, rendered).not.toBeNull();
    expect(JSON.parse(rendered_call![1]!)).toEqual(JSON.parse(call.function.arguments));
  });

  it('tool_choice "auto" leaves the choice to the model; what it writes in <tool_call> tags is parsed', () => {
    const text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>';
    const { content, calls } = parseToolCalls(text, SPECS, false);
    expect(content).toBe('Let me check.');
    expect(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([['get_weather', { city: 'Oslo', unit: 'c' }]]);
    // a call to a tool not given, or not JSON, stays text
    expect(parseToolCalls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', SPECS, false).calls).toEqual([]);
    expect(parseToolCalls('<tool_call>nope</tool_call>', SPECS, false).calls).toEqual([]);
  });

  it('refused by name: an unknown named tool, tool_choice without tools, a tool message without its call id', async () => {
    const post = async (body: Record<string, unknown>) => {
      const res = await fetch(`${serve.base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json' }, body: JSON.stringify({ model, messages, max_tokens: 2, ...body }) });
      return { status: res.status, param: ((await res.json()) as { error: { param?: string } }).error.param };
    };
    expect(await post({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } })).toEqual({ status: 400, param: 'tool_choice' });
    expect(await post({ tool_choice: 'required' })).toEqual({ status: 400, param: 'tool_choice' });
    expect(await post({ messages: [...messages, { role: 'tool', content: 'x' }] })).toEqual({ status: 400, param: `messages.${messages.length}.tool_call_id` });
  });
});
