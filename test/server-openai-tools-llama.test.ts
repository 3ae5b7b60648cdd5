// Tool calling in the second format, Llama 3.1–3.3's JSON ({"name", "parameters"} as the whole
// reply, results in an ipython turn), through Llama 3.2's own template from llama.cpp's
// models/templates on a small synthetic llama: a forced call constrained to {"name",
// "parameters"} and returned as tool_calls (streamed piece by piece, the same as whole), "auto"
// streaming what the model writes as it comes, and the round trip rendered back. The official
// `openai` client against `serve` + one node.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type OpenAI from 'openai';
import { expectAutoStreamsAsWhole, roundTrip, WEATHER_TOOL, serveWithTemplate, streamed as streamedOn } from './support/tool-serve.ts';
import type { ToolServe } from './support/tool-serve.ts';

let t: ToolServe;
let openai: OpenAI;
let model: string;

const TOOLS: OpenAI.ChatCompletionTool[] = [
  WEATHER_TOOL,
];
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is the weather in Paris?' }];

beforeAll(async () => {
  t = await serveWithTemplate('meta-llama-Llama-3.2-3B-Instruct', 6);
  ({ openai, model } = t);
});

afterAll(() => t.close());

const streamed = (body: OpenAI.ChatCompletionCreateParamsStreaming) => streamedOn(openai, body);

describe('tools in the Llama 3.x JSON format', () => {
  it('a forced call is a {"name", "parameters"} object read back as tool_calls; streamed in pieces that make up the same call', async () => {
    for (let seed = 1; seed <= 3; seed++) {
      const body = { model, messages, tools: TOOLS, tool_choice: 'required' as const, temperature: 1, seed, max_tokens: 300 };
      const c = (await openai.chat.completions.create(body)).choices[0]!;
      expect(c.finish_reason, JSON.stringify(c.message)).toBe('tool_calls');
      const call = c.message.tool_calls![0]!;
      expect(call.function.name).toBe('get_weather');
      const args = JSON.parse(call.function.arguments);
      expect(typeof args.city === 'string' && args.city.length <= 12).toBe(true);
      expect(['c', 'f']).toContain(args.unit);
      const s = await streamed({ ...body, stream: true });
      expect(s.deltas[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'get_weather', arguments: '' } });
      expect(s.deltas.length).toBeGreaterThan(3);
      expect(s.deltas.slice(1).map((d) => d.function?.arguments ?? '').join('')).toBe(call.function.arguments);
      expect(s.finish).toBe('tool_calls');
    }
  });

  it('"auto": what the model writes streams as it comes and reads the same as the whole reply of the same seed', () =>
    expectAutoStreamsAsWhole(t, { model, messages, tools: TOOLS, temperature: 1, max_tokens: 24 }));

  it('round trip: the call as {"name", "parameters"} and the result as an ipython turn, rendered into the next prompt', async () => {
    const { rendered, call } = await roundTrip(t, messages, TOOLS, 'get_weather');
    // the template prints a string result through tojson (a string is iterable to jinja), as it does in transformers
    expect(rendered).toContain('<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 18}"<|eot_id|>');
    const renderedCall = /<\|start_header_id\|>assistant<\|end_header_id\|>\n\n\{"name": "get_weather", "parameters": (.*)\}<\|eot_id\|>/.exec(rendered);
    expect(renderedCall, rendered).not.toBeNull();
    expect(JSON.parse(renderedCall![1]!)).toEqual(JSON.parse(call.function.arguments));
  });
});
