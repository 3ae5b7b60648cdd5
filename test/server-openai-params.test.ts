// The OpenAI API's parameters, with the official `openai` client against `serve` + a two-node
// route on stories260K: sampling parameters honoured at the last stage (penalties with the
// token history it now gets) and token-identical to llama.cpp's chain; logprobs/top_logprobs on
// both endpoints, streamed = non-streamed; n choices; echo; and every other parameter refused
// with a 400 that names it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { stories260K } from './support/models.ts';
import { killAll, serveWithNodes } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { StepperGenerator } from '../src/route/generation-loop.ts';
import type { SamplerOptions } from '../src/model/sampler.ts';
import { tokenLogprob } from '../src/model/sampler.ts';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';

let serve: ServeInfo;
let openai: OpenAI;
let tokenizer: Tokenizer;
let llama: StepperGenerator;
let modelPath: string;
const PROMPT = 'Once upon a time';

beforeAll(async () => {
  modelPath = await stories260K();
  serve = await serveWithNodes(modelPath, ['a', 'b']);
  openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
  tokenizer = Tokenizer.fromMetadata((await readHeader(modelPath)).metadata);
  llama = new StepperGenerator(await LlamaCppModel.load(modelPath, { threads: 1, contextLength: 256 }), tokenizer);
});

afterAll(async () => {
  await llama?.dispose();
  await killAll();
});

/** The HTTP status and OpenAI error body of a request the server refuses. */
async function refused(path: string, body: Record<string, unknown>): Promise<{ status: number; error: { param?: string; message: string; code: string } }> {
  const res = await fetch(`${serve.base}${path}`, { method: 'POST', headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, error: ((await res.json()) as { error: { param?: string; message: string; code: string } }).error };
}

describe('sampling parameters over a two-node route = llama.cpp', () => {
  // OpenAI names → our settings, as llama.cpp (node-llama-cpp) runs them
  const CASES: Array<[string, Record<string, unknown>, SamplerOptions]> = [
    ['top_k, min_p, seed', { temperature: 0.9, top_k: 30, min_p: 0.05, seed: 42 }, { temperature: 0.9, topK: 30, minP: 0.05, seed: 42 }],
    [
      'presence, frequency and repetition penalties (the last stage gets the prompt and keeps what it samples)',
      { temperature: 0, presence_penalty: 0.6, frequency_penalty: 0.5, repetition_penalty: 1.3 },
      { temperature: 0, presencePenalty: 0.6, frequencyPenalty: 0.5, repeatPenalty: 1.3 },
    ],
    [
      'penalties, a window, top_p and a seed',
      { temperature: 0.8, top_k: 40, top_p: 0.9, frequency_penalty: 0.3, repeat_penalty: 1.1, repeat_last_n: 16, seed: 3 },
      { temperature: 0.8, topK: 40, topP: 0.9, frequencyPenalty: 0.3, repeatPenalty: 1.1, repeatLastN: 16, seed: 3 },
    ],
    ['logit_bias (a ban and a push)', { temperature: 0, logit_bias: { '261': -100, '395': 3 } }, { temperature: 0, logitBias: { '261': -100, '395': 3 } }],
  ];
  for (const [name, params, sampler] of CASES) {
    it(name, async () => {
      const promptTokens = tokenizer.encode(PROMPT);
      const expected = await llama.generate({ promptTokens, maxTokens: 40, sampler });
      const r = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 40, ...params } as OpenAI.CompletionCreateParamsNonStreaming);
      expect(r.choices[0]!.text).toBe(expected.text);
      const stream = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 40, stream: true, ...params } as OpenAI.CompletionCreateParamsStreaming);
      let text = '';
      for await (const c of stream) text += c.choices[0]?.text ?? '';
      expect(text).toBe(expected.text);
    });
  }

  it('the penalties change the text (so the comparisons above can fail)', async () => {
    const plain = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 40, temperature: 0 });
    const penalised = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 40, temperature: 0, presence_penalty: 0.6, frequency_penalty: 0.5, repetition_penalty: 1.3 } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(penalised.choices[0]!.text).not.toBe(plain.choices[0]!.text);
  });
});

describe('logprobs', () => {
  it('chat: logprobs and top_logprobs, streamed = non-streamed; the first token\'s matches the CPU engine\'s log-softmax', async () => {
    const messages = [{ role: 'user' as const, content: 'Tell me a story.' }];
    const full = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = full.choices[0]!.logprobs!.content!;
    expect(content.length).toBeGreaterThan(0);
    expect(content.map((c) => c.token).join('')).toBe(full.choices[0]!.message.content);
    for (const c of content) {
      expect(c.top_logprobs.length).toBe(3);
      expect(c.logprob).toBeLessThanOrEqual(0);
      // greedy: the chosen token is the most likely one
      expect(c.top_logprobs[0]!.token).toBe(c.token);
      expect(c.top_logprobs[0]!.logprob).toBeCloseTo(c.logprob, 6);
      expect(c.top_logprobs[1]!.logprob).toBeLessThanOrEqual(c.top_logprobs[0]!.logprob);
      expect(Buffer.from(c.bytes!).toString()).toBe(c.token);
    }
    const stream = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3, stream: true });
    const streamed: typeof content = [];
    for await (const c of stream) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
    expect(streamed).toEqual(content);

    // the oracle: the whole model on the CPU engine (the route sends f16 hidden states between its stages)
    const source = await openTensorSource(modelPath);
    const cpu = new CpuBackend();
    await cpu.load(source, { start: 0, end: 5 });
    try {
      const prompt = tokenizer.encode((await import('../src/model/chat-template.ts')).ChatTemplate.fromMetadata(source.header.metadata, { tokenizer, fallback: true }).prompt(tokenizer, messages));
      await cpu.openSession('x', { contextLength: 64 });
      const out = await cpu.forward('x', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0);
      if (out.output.kind !== 'logits') throw new Error('expected logits');
      const ref = tokenLogprob(out.output.logits, 0, 3);
      expect(new TextDecoder().decode(tokenizer.tokenPiece(ref.top[0]!.token))).toBe(content[0]!.token);
      expect(Math.abs(ref.top[0]!.logprob - content[0]!.logprob)).toBeLessThan(1e-2);
      expect(Math.abs(ref.top[1]!.logprob - content[0]!.top_logprobs[1]!.logprob)).toBeLessThan(1e-2);
    } finally {
      await cpu.dispose();
      await source.close();
    }
  });

  it('completions: logprobs = k gives tokens, token_logprobs, top_logprobs and text_offset, streamed = non-streamed', async () => {
    const full = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 10, temperature: 0.8, seed: 5, logprobs: 2 });
    const lp = full.choices[0]!.logprobs!;
    expect(lp.tokens!.join('')).toBe(full.choices[0]!.text);
    expect(lp.token_logprobs!.length).toBe(lp.tokens!.length);
    expect(lp.top_logprobs!.every((t) => Object.keys(t).length <= 2)).toBe(true);
    expect(lp.text_offset![0]).toBe(0);
    expect(lp.text_offset![1]).toBe(lp.tokens![0]!.length);
    const stream = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 10, temperature: 0.8, seed: 5, logprobs: 2, stream: true });
    const tokens: string[] = [];
    const values: number[] = [];
    for await (const c of stream) {
      tokens.push(...(c.choices[0]?.logprobs?.tokens ?? []));
      values.push(...(c.choices[0]?.logprobs?.token_logprobs ?? []));
    }
    expect(tokens).toEqual(lp.tokens);
    expect(values).toEqual(lp.token_logprobs);
  });
});

describe('n and echo', () => {
  it('n = 3 gives three choices; choice i is what n = 1 gives with seed + i', async () => {
    const r = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 16, temperature: 1, seed: 10, n: 3 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(new Set(r.choices.map((c) => c.text)).size).toBe(3);
    const single = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 16, temperature: 1, seed: 12 });
    expect(r.choices[2]!.text).toBe(single.choices[0]!.text);
    // usage counts every choice's tokens: 16 for each that ran to the limit, fewer for one that ended
    const full = r.choices.filter((c) => c.finish_reason === 'length').length;
    expect(r.usage!.completion_tokens).toBeGreaterThanOrEqual(16 * full);
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(48);
  });

  it('chat n = 2 streamed: chunks by index concatenate to the non-streamed choices', async () => {
    const messages = [{ role: 'user' as const, content: 'Hi' }];
    const full = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, temperature: 1, seed: 4, n: 2 });
    const stream = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, temperature: 1, seed: 4, n: 2, stream: true });
    const texts = ['', ''];
    for await (const c of stream) for (const ch of c.choices) texts[ch.index] += ch.delta?.content ?? '';
    expect(texts).toEqual(full.choices.map((c) => c.message.content));
  });

  it('echo puts the prompt before the completion', async () => {
    const r = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 8, temperature: 0, echo: true });
    const plain = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 8, temperature: 0 });
    expect(r.choices[0]!.text).toBe(PROMPT + plain.choices[0]!.text);
  });
});

describe('no parameter silently ignored', () => {
  const REFUSED: Array<[string, string, Record<string, unknown>]> = [
    ['/v1/chat/completions', 'response_format', { response_format: { type: 'yaml' } }],
    ['/v1/chat/completions', 'response_format', { response_format: { type: 'json_schema', json_schema: { name: 'x' } } }],
    ['/v1/chat/completions', 'tools', { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }],
    ['/v1/chat/completions', 'tool_choice', { tool_choice: 'required' }],
    ['/v1/chat/completions', 'top_logprobs', { top_logprobs: 2 }],
    ['/v1/chat/completions', 'top_logprobs', { logprobs: true, top_logprobs: 21 }],
    ['/v1/chat/completions', 'store', { store: true }],
    ['/v1/chat/completions', 'audio', { audio: { voice: 'x', format: 'wav' } }],
    ['/v1/chat/completions', 'echo', { echo: true }],
    ['/v1/completions', 'suffix', { suffix: 'The end.' }],
    ['/v1/completions', 'best_of', { best_of: 3 }],
    ['/v1/completions', 'echo', { echo: true, logprobs: 1 }],
    ['/v1/completions', 'logprobs', { logprobs: 6 }],
    ['/v1/completions', 'logit_bias', { logit_bias: { '99999': 1 } }],
    ['/v1/completions', 'logit_bias', { logit_bias: { '3': 101 } }],
    ['/v1/completions', 'top_k', { top_k: 1.5 }],
    ['/v1/completions', 'min_p', { min_p: 2 }],
    ['/v1/completions', 'presence_penalty', { presence_penalty: 3 }],
    ['/v1/completions', 'frequency_penalty', { frequency_penalty: 'a lot' }],
    ['/v1/completions', 'repetition_penalty', { repetition_penalty: 0 }],
    ['/v1/completions', 'n', { n: 0 }],
    ['/v1/completions', 'prompt', { prompt: ['a', 'b'] }],
    ['/v1/completions', 'top_p', { top_p: 0 }],
    ['/v1/completions', 'frobnicate', { frobnicate: 1 }],
    ['/v1/completions', 'messages', { messages: [] }],
  ];
  it('each refused with a 400 that names it, and the API goes on', async () => {
    for (const [path, param, extra] of REFUSED) {
      const base = path === '/v1/completions' ? { model: 'stories260K', prompt: PROMPT, max_tokens: 2 } : { model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };
      const r = await refused(path, { ...base, ...extra });
      expect({ path, param, status: r.status, got: r.error.param }).toEqual({ path, param, status: 400, got: param });
      expect(r.error.message).toContain(param);
    }
    // the official client surfaces the named parameter too
    const err = await openai.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((err as InstanceType<typeof OpenAI.APIError>).param).toBe('tools');
    const ok = await openai.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 2, temperature: 0, user: 'someone', response_format: undefined } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(ok.choices[0]!.text.length).toBeGreaterThan(0);
  });
});

describe('KV reuse across chat turns', () => {
  /** a conversation of `turns` user messages, each turn's reply appended, run with or without the cache */
  async function converse(turns: string[], extra: Record<string, unknown>): Promise<Array<{ text: string; cached: number; prompt: number }>> {
    const messages: Array<{ role: 'user' | 'assistant'; content: string }> = [];
    const out: Array<{ text: string; cached: number; prompt: number }> = [];
    for (const t of turns) {
      messages.push({ role: 'user', content: t });
      const r = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 12, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      const text = r.choices[0]!.message.content ?? '';
      messages.push({ role: 'assistant', content: text });
      out.push({ text, cached: r.usage!.prompt_tokens_details?.cached_tokens ?? -1, prompt: r.usage!.prompt_tokens });
    }
    return out;
  }
  const TURNS = ['Tell me a story.', 'What happened next?', 'And then?', 'Who was there?'];

  it('turn k continues turn k−1\'s session: cached_tokens counts the shared prefix, and the text is a fresh session\'s (greedy, sampled, penalised)', async () => {
    for (const extra of [{ temperature: 0 }, { temperature: 0.9, top_k: 40, seed: 8 }, { temperature: 0, frequency_penalty: 0.5, presence_penalty: 0.3 }]) {
      const fresh = await converse(TURNS, { ...extra, cache_prompt: false });
      const reused = await converse(TURNS, extra);
      expect(reused.map((r) => r.text)).toEqual(fresh.map((r) => r.text));
      expect(fresh.every((r) => r.cached === 0)).toBe(true);
      // turn 1 may share a prefix with a conversation kept before (the same first message): never the whole prompt
      expect(reused[0]!.cached).toBeLessThan(reused[0]!.prompt);
      // later turns: everything but the new message (and its template tokens) came from the kept KV
      for (const [i, r] of reused.entries()) if (i > 0) expect(r.cached).toBeGreaterThan(reused[i - 1]!.prompt - 2);
    }
  });

  it('a prompt that diverges early rewinds to the common prefix and still gives a fresh session\'s text', async () => {
    const a = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time there was a dog', max_tokens: 10, temperature: 0 });
    expect(a.usage!.prompt_tokens_details?.cached_tokens ?? 0).toBeGreaterThanOrEqual(0);
    const b = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time there was a cat', max_tokens: 10, temperature: 0 });
    const fresh = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time there was a cat', max_tokens: 10, temperature: 0, cache_prompt: false } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(b.usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThan(4);
    expect(b.choices[0]!.text).toBe(fresh.choices[0]!.text);
  });
});

describe('structured output (response_format, xgrammar)', () => {
  const SCHEMA = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 10 },
      mood: { enum: ['happy', 'sad', 'sleepy'] },
      friends: { type: 'integer', minimum: 0, maximum: 99 },
      brave: { type: 'boolean' },
    },
    required: ['name', 'mood', 'friends', 'brave'],
    additionalProperties: false,
  };

  it('json_schema: every sampled output parses and matches the schema, streamed and not', async () => {
    const messages = [{ role: 'user' as const, content: 'Describe the cat as JSON.' }];
    const response_format = { type: 'json_schema' as const, json_schema: { name: 'cat', schema: SCHEMA, strict: true } };
    for (let seed = 1; seed <= 6; seed++) {
      const r = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 120, temperature: 1, seed, response_format });
      const v = JSON.parse(r.choices[0]!.message.content!);
      expect(Object.keys(v).sort()).toEqual(['brave', 'friends', 'mood', 'name']);
      expect(typeof v.name === 'string' && v.name.length <= 10).toBe(true);
      expect(['happy', 'sad', 'sleepy']).toContain(v.mood);
      expect(Number.isInteger(v.friends) && v.friends >= 0 && v.friends <= 99).toBe(true);
      expect(typeof v.brave).toBe('boolean');
      expect(r.choices[0]!.finish_reason).toBe('stop');
      if (seed === 1) {
        const stream = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 120, temperature: 1, seed, response_format, stream: true });
        let text = '';
        for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
        expect(text).toBe(r.choices[0]!.message.content);
      }
    }
  });

  it('json_object: the output is JSON (greedy, and with logprobs)', async () => {
    const r = await openai.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 200, temperature: 0, response_format: { type: 'json_object' }, logprobs: true, top_logprobs: 2 });
    const text = r.choices[0]!.message.content!;
    expect(text.startsWith('{'), text).toBe(true);
    if (r.choices[0]!.finish_reason === 'stop') expect(typeof JSON.parse(text)).toBe('object');
    expect(r.choices[0]!.logprobs!.content!.map((c) => c.token).join('')).toBe(text);
    // without the constraint the model writes a story, not JSON
    const plain = await openai.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 20, temperature: 0 });
    expect(plain.choices[0]!.message.content!.trimStart().startsWith('{')).toBe(false);
  });
});
