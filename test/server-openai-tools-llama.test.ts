// Tool calling in the second format, Llama 3.1–3.3's JSON ({"name", "parameters"} as the whole
// reply, results in an ipython turn), through Llama 3.2's own template from llama.cpp's
// models/templates on a small synthetic llama: a forced call constrained to {"name",
// "parameters"} and returned as tool_calls (streamed piece by piece, the same as whole), "auto"
// streaming what the model writes as it comes, and the round trip rendered back. The official
// `openai` client against `serve` + one node.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { syntheticModelSpec } from '../src/model/synthetic-model.ts';
import { writeGgufFile } from '../src/gguf/writer.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { ChatTemplate } from '../src/model/chat-template.ts';
import type { ChatMessage } from '../src/model/chat-template.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { templateMessage, templateTools } from '../signaling-server/openai-tools.ts';
import { killAll, serveWithNodes } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { templatePath } from './tokenizer-fixtures.ts';

const dir = mkdtempSync(join(tmpdir(), 'openai-tools-llama-'));
let serve: ServeInfo;
let openai: OpenAI;
let model: string;
let template: ChatTemplate;
let tokenizer: Tokenizer;

const TOOLS: OpenAI.ChatCompletionTool[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false },
    },
  },
];
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is the weather in Paris?' }];

beforeAll(async () => {
  const spec = syntheticModelSpec({ layers: 2, embd: 64, ffn: 128, vocab: 1024, heads: 4, seed: 6 });
  const source = readFileSync(templatePath('meta-llama-Llama-3.2-3B-Instruct'), 'utf8');
  const metadata = spec.metadata.map((m) => (m.key === 'tokenizer.chat_template' ? { key: m.key, type: 'string' as const, value: source } : m));
  const path = join(dir, 'tools-llama.gguf');
  await writeGgufFile(path, { ...spec, metadata });
  const header = await readHeader(path);
  tokenizer = Tokenizer.fromMetadata(header.metadata);
  template = ChatTemplate.fromMetadata(header.metadata, { tokenizer });
  serve = await serveWithNodes(path, ['a']);
  openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
  model = (await openai.models.list()).data[0]!.id;
});

afterAll(async () => {
  await killAll();
  rmSync(dir, { recursive: true, force: true });
});

async function streamed(body: OpenAI.ChatCompletionCreateParamsStreaming) {
  const deltas: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
  let content = '';
  let contentChunks = 0;
  let finish: string | null = null;
  for await (const c of await openai.chat.completions.create(body)) {
    deltas.push(...(c.choices[0]?.delta?.tool_calls ?? []));
    content += c.choices[0]?.delta?.content ?? '';
    if (c.choices[0]?.delta?.content) contentChunks++;
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  return { deltas, content, contentChunks, finish };
}

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

  it('"auto": what the model writes streams as it comes and reads the same as the whole reply of the same seed', async () => {
    for (let seed = 1; seed <= 2; seed++) {
      const body = { model, messages, tools: TOOLS, temperature: 1, seed, max_tokens: 24 };
      const whole = (await openai.chat.completions.create(body)).choices[0]!;
      const s = await streamed({ ...body, stream: true });
      expect(s.content).toBe(whole.message.content ?? '');
      // text goes out token by token, not once the reply is done
      if ((whole.message.content ?? '').length > 8) expect(s.contentChunks).toBeGreaterThan(2);
      expect(s.finish).toBe(whole.finish_reason);
      expect(s.deltas.length > 0).toBe((whole.message.tool_calls ?? []).length > 0);
    }
  });

  it('round trip: the call as {"name", "parameters"} and the result as an ipython turn, rendered into the next prompt', async () => {
    const first = await openai.chat.completions.create({ model, messages, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 0, max_tokens: 300 });
    const call = first.choices[0]!.message.tool_calls![0]!;
    const next: OpenAI.ChatCompletionMessageParam[] = [...messages, { role: 'assistant', content: null, tool_calls: [call] }, { role: 'tool', tool_call_id: call.id, content: '{"temp": 18}' }];
    const r = await openai.chat.completions.create({ model, messages: next, tools: TOOLS, temperature: 0, max_tokens: 8 });
    expect(r.choices[0]!.finish_reason).not.toBeNull();
    const specs = TOOLS.map((t) => ({ name: t.function.name, parameters: t.function.parameters as Record<string, unknown>, ...(t.function.description ? { description: t.function.description } : {}) }));
    const rendered = template.prompt(tokenizer, next.map((m) => templateMessage({ ...(m as object), role: m.role, content: typeof m.content === 'string' ? m.content : '' } as never)) as unknown as ChatMessage[], { variables: { tools: templateTools(specs) } });
    // the template prints a string result through tojson (a string is iterable to jinja), as it does in transformers
    expect(rendered).toContain('<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 18}"<|eot_id|>');
    const renderedCall = /<\|start_header_id\|>assistant<\|end_header_id\|>\n\n\{"name": "get_weather", "parameters": (.*)\}<\|eot_id\|>/.exec(rendered);
    expect(renderedCall, rendered).not.toBeNull();
    expect(JSON.parse(renderedCall![1]!)).toEqual(JSON.parse(call.function.arguments));
    expect(r.usage!.prompt_tokens).toBe(tokenizer.encode(rendered).length);
  });
});
