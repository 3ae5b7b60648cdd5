// Tool calling for chat templates that speak the Hermes/Qwen format: the template renders
// `tools` itself (the model's own jinja: a <tools> block in the system turn, assistant calls as
// <tool_call>{"name", "arguments"}</tool_call>, results as <tool_response>), and calls are read
// back from the same tags. tool_choice "required" or a named function constrains the output to
// a call (a JSON schema over the tools, xgrammar); "auto" lets the model choose and parses what
// it wrote. A template without <tool_call> is refused by name: its format is not parsed here.

import { randomBytes } from 'node:crypto';
import type { ChatTemplate } from '../src/model/chat-template.ts';
import { badParam } from './openai-request.ts';
import type { OutputFormat } from './openai-request.ts';

export interface ToolSpec {
  name: string;
  description?: string;
  parameters: Record<string, unknown>;
}

export type ToolChoice = 'auto' | 'required' | { name: string };

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

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

/** Refuses tools for a template that does not render them in the format parsed here. */
export function checkToolTemplate(template: ChatTemplate): void {
  if (template.isFallback || !template.source.includes('<tool_call>') || !template.source.includes('tools')) {
    throw badParam('tools', "this model's chat template does not render tools in the Hermes/Qwen <tool_call> format, the one parsed here");
  }
}

/** The template's `tools` variable: OpenAI's own shape, as the templates expect it. */
export function templateTools(tools: readonly ToolSpec[]): unknown[] {
  return tools.map((t) => ({ type: 'function', function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.parameters } }));
}

/** The output constraint for a forced call: one {"name", "arguments"} object over the allowed tools. */
export function forcedCallFormat(tools: readonly ToolSpec[], choice: ToolChoice): OutputFormat | null {
  if (choice === 'auto') return null;
  const allowed = typeof choice === 'object' ? tools.filter((t) => t.name === choice.name) : tools;
  const one = (t: ToolSpec) => ({ type: 'object', properties: { name: { const: t.name }, arguments: t.parameters }, required: ['name', 'arguments'], additionalProperties: false });
  return { kind: 'schema', schema: allowed.length === 1 ? one(allowed[0]!) : { anyOf: allowed.map(one) } };
}

const callId = (): string => `call_${randomBytes(12).toString('hex')}`;

function asCall(v: unknown, tools: readonly ToolSpec[]): ToolCall | null {
  const o = v as { name?: unknown; arguments?: unknown };
  if (typeof o?.name !== 'string' || !tools.some((t) => t.name === o.name)) return null;
  const args = typeof o.arguments === 'string' ? o.arguments : JSON.stringify(o.arguments ?? {});
  return { id: callId(), type: 'function', function: { name: o.name, arguments: args } };
}

/** The calls in a reply and the text around them: a forced call's whole output is the call's JSON; otherwise <tool_call> blocks. */
export function parseToolCalls(text: string, tools: readonly ToolSpec[], forced: boolean): { content: string | null; calls: ToolCall[] } {
  if (forced) {
    try {
      const call = asCall(JSON.parse(text), tools);
      if (call) return { content: null, calls: [call] };
    } catch {
      // cut off by max_tokens: no call
    }
    return { content: text, calls: [] };
  }
  const calls: ToolCall[] = [];
  const rest = text.replace(/<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g, (whole, json: string) => {
    try {
      const call = asCall(JSON.parse(json), tools);
      if (call) {
        calls.push(call);
        return '';
      }
    } catch {
      // not JSON: left in the text
    }
    return whole;
  });
  return { content: calls.length > 0 ? rest.trim() || null : text, calls };
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
