// Tool calling through the model's own chat template: the template renders `tools` itself, and
// calls are read back (tool-call-reader.ts) in the format the template teaches. Two formats:
// Hermes/Qwen (a <tools> block, calls as <tool_call>{"name", "arguments"}</tool_call>, results
// as <tool_response>) and Llama 3.1–3.3's JSON (the reply is {"name", "parameters"}, results in
// an ipython turn). tool_choice "required" or a named function constrains the output to a call
// (a JSON schema over the tools, xgrammar); "auto" lets the model choose and reads what it
// wrote. A template in neither format is refused by name: its calls would not be read.

import type { ChatTemplate } from '../src/model/chat-template.ts';
import { badParam } from './openai-request.ts';
import type { OutputFormat } from './openai-request.ts';
import { ToolCallReader } from './tool-call-reader.ts';
import type { ToolCall, ToolCallSyntax } from './tool-call-reader.ts';

export type { ToolCall } from './tool-call-reader.ts';

/** A template's call format: how to know its template, and how its model writes a call. */
export interface ToolFormat extends ToolCallSyntax {
  name: string;
  /** the template teaches this format */
  matches: (source: string) => boolean;
}

export const TOOL_FORMATS: readonly ToolFormat[] = [
  { name: 'hermes', open: '<tool_call>', close: '</tool_call>', argsKey: 'arguments', matches: (src) => src.includes('<tool_call>') && src.includes('tools') },
  // Llama 3.1/3.2/3.3: custom tools answered as a bare JSON object (the template's own instruction)
  { name: 'llama3-json', open: null, close: null, argsKey: 'parameters', matches: (src) => src.includes('"parameters": dictionary of argument name and its value') },
];

export interface ToolSpec {
  name: string;
  description?: string;
  parameters: Record<string, unknown>;
}

export type ToolChoice = 'auto' | 'required' | { name: string };

/** Reads tools and tool_choice; null when no tool may be called (none given, or tool_choice "none"). */
export function toolsOf(tools: unknown, choice: unknown): { tools: ToolSpec[]; choice: ToolChoice } | null {
  if (choice === 'none') return null;
  if (tools === undefined || tools === null || (Array.isArray(tools) && tools.length === 0)) {
    if (choice !== undefined && choice !== null && choice !== 'auto') throw badParam('tool_choice', 'names a tool, but no tools are given');
    return null;
  }
  if (!Array.isArray(tools)) throw badParam('tools', 'must be an array');
  const specs = tools.map((t: unknown, i: number): ToolSpec => {
    const f = (t as { type?: unknown; function?: { name?: unknown; description?: unknown; parameters?: unknown } }).function;
    if ((t as { type?: unknown }).type !== 'function' || typeof f?.name !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(f.name)) throw badParam('tools', `tool ${i} must be {"type": "function", "function": {"name": …}} with a name of letters, digits, _ or -`);
    if (f.parameters !== undefined && (typeof f.parameters !== 'object' || f.parameters === null)) throw badParam('tools', `tool ${i}: parameters must be a JSON schema object`);
    return { name: f.name, ...(typeof f.description === 'string' ? { description: f.description } : {}), parameters: (f.parameters as Record<string, unknown>) ?? { type: 'object', properties: {} } };
  });
  let c: ToolChoice = 'auto';
  if (choice === 'required') c = 'required';
  else if (typeof choice === 'object' && choice !== null) {
    const name = (choice as { function?: { name?: unknown } }).function?.name;
    if (typeof name !== 'string' || !specs.some((s) => s.name === name)) throw badParam('tool_choice', `names no tool given in tools: ${JSON.stringify(choice)}`);
    c = { name };
  } else if (choice !== undefined && choice !== null && choice !== 'auto') throw badParam('tool_choice', `must be 'none', 'auto', 'required' or {"type": "function", "function": {"name": …}}, got ${JSON.stringify(choice)}`);
  return { tools: specs, choice: c };
}

/** The template's call format; refuses tools for a template in none of the formats read here. */
export function toolFormatOf(template: ChatTemplate): ToolFormat {
  const format = template.isFallback ? undefined : TOOL_FORMATS.find((f) => f.matches(template.source));
  if (!format) throw badParam('tools', "this model's chat template renders tools in neither format read here: Hermes/Qwen <tool_call> tags or Llama 3.1–3.3 JSON ({\"name\", \"parameters\"})");
  return format;
}

/** The template's `tools` variable: OpenAI's own shape, as the templates expect it. */
export function templateTools(tools: readonly ToolSpec[]): unknown[] {
  return tools.map((t) => ({ type: 'function', function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.parameters } }));
}

/** The output constraint for a forced call: one {"name", "arguments"} (or "parameters") object over the allowed tools. */
export function forcedCallFormat(tools: readonly ToolSpec[], choice: ToolChoice, format: ToolCallSyntax): OutputFormat | null {
  if (choice === 'auto') return null;
  const allowed = typeof choice === 'object' ? tools.filter((t) => t.name === choice.name) : tools;
  const key = format.argsKey;
  const one = (t: ToolSpec) => ({ type: 'object', properties: { name: { const: t.name }, [key]: t.parameters }, required: ['name', key], additionalProperties: false });
  return { kind: 'schema', schema: allowed.length === 1 ? one(allowed[0]!) : { anyOf: allowed.map(one) } };
}

/** A reader of one reply's calls: a forced call's whole output is the call's JSON; otherwise the format's own. */
export function toolReader(format: ToolCallSyntax, tools: readonly ToolSpec[], forced: boolean): ToolCallReader {
  return new ToolCallReader(format, new Set(tools.map((t) => t.name)), forced);
}

/** The calls in a whole reply and the text around them (a malformed or cut call stays text). */
export function parseToolCalls(text: string, tools: readonly ToolSpec[], forced: boolean, format: ToolCallSyntax = TOOL_FORMATS[0]!): { content: string | null; calls: ToolCall[] } {
  const reader = toolReader(format, tools, forced);
  reader.push(text);
  reader.end();
  return reader.result();
}

/** A message as the template sees it: assistant tool_calls with parsed arguments, tool results with their call id. */
export function templateMessage(m: { role: string; content: string; tool_calls?: unknown; tool_call_id?: unknown }): Record<string, unknown> {
  const out: Record<string, unknown> = { role: m.role, content: m.content };
  if (Array.isArray(m.tool_calls)) {
    out.tool_calls = m.tool_calls.map((c: { id?: string; function?: { name?: string; arguments?: string } }) => {
      let args: unknown = c.function?.arguments ?? '{}';
      try {
        args = JSON.parse(String(args));
      } catch {
        // a string the template prints as given
      }
      return { id: c.id, type: 'function', function: { name: c.function?.name, arguments: args } };
    });
  }
  if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
  return out;
}
