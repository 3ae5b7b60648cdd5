// OpenAI's response shapes for what a choice produced: log-probabilities as chat
// (`logprobs.content[]` with bytes and top_logprobs) and as completions (`tokens`,
// `token_logprobs`, `top_logprobs`, `text_offset`), and streamed tool calls' deltas.

import type { SampledLogprob } from '../src/protocol/payload.ts';
import type { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import type { ToolEvent } from './tool-call-reader.ts';

const lossy = new TextDecoder('utf-8');

/** A token's text and bytes as OpenAI reports them (a lone byte of a multi-byte character decodes lossily; `bytes` keeps it exact). */
function pieceOf(tokenizer: Tokenizer, id: number): { token: string; bytes: number[] } {
  const b = tokenizer.tokenPiece(id);
  return { token: lossy.decode(b), bytes: Array.from(b) };
}

export function chatLogprobs(tokenizer: Tokenizer, lps: readonly SampledLogprob[]): { content: unknown[]; refusal: null } {
  return {
    content: lps.map((lp) => ({
      ...pieceOf(tokenizer, lp.token),
      logprob: lp.logprob,
      top_logprobs: lp.top.map((t) => ({ ...pieceOf(tokenizer, t.token), logprob: t.logprob })),
    })),
    refusal: null,
  };
}

/** completions' logprobs; `offset`: characters of text before the first of these tokens */
export function completionLogprobs(tokenizer: Tokenizer, lps: readonly SampledLogprob[], offset: number): unknown {
  const tokens = lps.map((lp) => pieceOf(tokenizer, lp.token).token);
  const textOffset: number[] = [];
  let at = offset;
  for (const t of tokens) {
    textOffset.push(at);
    at += t.length;
  }
  return {
    tokens,
    token_logprobs: lps.map((lp) => lp.logprob),
    top_logprobs: lps.map((lp) => Object.fromEntries(lp.top.map((t) => [pieceOf(tokenizer, t.token).token, t.logprob]))),
    text_offset: textOffset,
  };
}

/** A chat chunk's delta for a streamed call, as OpenAI sends it: the call's first delta names it (arguments ""), then pieces of its arguments. */
export function toolDelta(e: Exclude<ToolEvent, { kind: 'content' }>): { tool_calls: unknown[] } {
  return e.kind === 'call'
    ? { tool_calls: [{ index: e.index, id: e.id, type: 'function', function: { name: e.name, arguments: '' } }] }
    : { tool_calls: [{ index: e.index, function: { arguments: e.text } }] };
}
