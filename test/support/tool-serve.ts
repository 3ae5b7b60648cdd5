// The harness of the tool-calling tests: a small synthetic llama whose chat template is a real
// one from llama.cpp's models/templates, served by `serve` + one node and reached through the
// official `openai` client; a streamed request read back as its deltas; the round trip of a call
// and its result through the template.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';
import OpenAI from 'openai';
import { syntheticModelSpec } from '../../src/model/synthetic-model.ts';
import { writeGgufFile } from '../../src/gguf/writer.ts';
import { readHeader } from '../../src/gguf/parse.ts';
import { ChatTemplate } from '../../src/model/chat-template.ts';
import { Tokenizer } from '../../src/model/tokenizer/tokenizer.ts';
import type { ChatMessage } from '../../src/model/chat-template.ts';
import { templateMessage, templateTools } from '../../signaling-server/openai-tools.ts';
import type { ToolSpec } from '../../signaling-server/openai-tools.ts';
import { killAll, serveWithNodes } from './mesh.ts';
import type { ServeInfo } from './mesh.ts';
import { templatePath } from '../tokenizer-fixtures.ts';

export interface ToolServe {
  serve: ServeInfo;
  openai: OpenAI;
  model: string;
  template: ChatTemplate;
  tokenizer: Tokenizer;
  /** stops serve and the node, removes the model */
  close: () => Promise<void>;
}

/** Serves a synthetic llama (weights from `seed`) whose chat template is llama.cpp's `templateName`. */
export async function serveWithTemplate(templateName: string, seed: number): Promise<ToolServe> {
  const dir = mkdtempSync(join(tmpdir(), 'openai-tools-'));
  const spec = syntheticModelSpec({ layers: 2, embd: 64, ffn: 128, vocab: 1024, heads: 4, seed });
  const source = readFileSync(templatePath(templateName), 'utf8');
  const metadata = spec.metadata.map((m) => (m.key === 'tokenizer.chat_template' ? { key: m.key, type: 'string' as const, value: source } : m));
  const path = join(dir, 'tools.gguf');
  await writeGgufFile(path, { ...spec, metadata });
  const header = await readHeader(path);
  const tokenizer = Tokenizer.fromMetadata(header.metadata);
  const template = ChatTemplate.fromMetadata(header.metadata, { tokenizer });
  const serve = await serveWithNodes(path, ['a']);
  const openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
  const model = (await openai.models.list()).data[0]!.id;
  const close = async (): Promise<void> => {
    await killAll();
    rmSync(dir, { recursive: true, force: true });
  };
  return { serve, openai, model, template, tokenizer, close };
}

/** a tool both formats' tests call: its schema bounds what a forced call may write */
export const WEATHER_TOOL: OpenAI.ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false },
  },
};

export const specsOf = (tools: readonly OpenAI.ChatCompletionTool[]): ToolSpec[] =>
  tools.map((t) => ({ name: t.function.name, ...(t.function.description ? { description: t.function.description } : {}), parameters: t.function.parameters as Record<string, unknown> }));

/** A streamed request's tool_calls deltas, content (and in how many chunks it came) and finish_reason, read through the client. */
export async function streamed(openai: OpenAI, body: OpenAI.ChatCompletionCreateParamsStreaming) {
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

/** With tool_choice "auto", what the model writes streams token by token and reads the same as the whole reply of the same seed. */
export async function expectAutoStreamsAsWhole(t: ToolServe, body: OpenAI.ChatCompletionCreateParamsNonStreaming): Promise<void> {
  for (let seed = 1; seed <= 2; seed++) {
    const whole = (await t.openai.chat.completions.create({ ...body, seed })).choices[0]!;
    const s = await streamed(t.openai, { ...body, seed, stream: true });
    expect(s.content).toBe(whole.message.content ?? '');
    // text goes out token by token, not once the reply is done
    if ((whole.message.content ?? '').length > 8) expect(s.contentChunks).toBeGreaterThan(2);
    expect(s.finish).toBe(whole.finish_reason);
    expect(s.deltas.length > 0).toBe((whole.message.tool_calls ?? []).length > 0);
  }
}

/**
 * A call to `name`, then its result `{"temp": 18}` as a role "tool" message, sent back; checks the
 * server's prompt is the template's rendering of both (its token count) and returns that
 * rendering, and the call, for the format's own checks.
 */
export async function roundTrip(t: ToolServe, messages: OpenAI.ChatCompletionMessageParam[], tools: OpenAI.ChatCompletionTool[], name: string): Promise<{ rendered: string; call: OpenAI.ChatCompletionMessageToolCall }> {
  const { openai, model } = t;
  const first = await openai.chat.completions.create({ model, messages, tools, tool_choice: { type: 'function', function: { name } }, temperature: 0, max_tokens: 300 });
  const call = first.choices[0]!.message.tool_calls![0]!;
  const next: OpenAI.ChatCompletionMessageParam[] = [...messages, { role: 'assistant', content: null, tool_calls: [call] }, { role: 'tool', tool_call_id: call.id, content: '{"temp": 18}' }];
  const r = await openai.chat.completions.create({ model, messages: next, tools, temperature: 0, max_tokens: 8 });
  expect(r.choices[0]!.finish_reason).not.toBeNull();
  const asTemplate = next.map((m) => templateMessage({ ...(m as object), role: m.role, content: typeof m.content === 'string' ? m.content : '' } as never)) as unknown as ChatMessage[];
  const rendered = t.template.prompt(t.tokenizer, asTemplate, { variables: { tools: templateTools(specsOf(tools)) } });
  expect(r.usage!.prompt_tokens).toBe(t.tokenizer.encode(rendered).length);
  return { rendered, call };
}
