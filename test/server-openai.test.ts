// The official `openai` client against `serve` + a two-node route on stories260K: streamed and
// non-streamed chat and completions, usage, progress before the first token, cancellation
// freeing every stage's KV cache, and an error event naming a killed stage.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K } from './support/models.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { ChatTemplate } from '../src/model/chat-template.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { readSse } from './support/sse.ts';

let serve: ServeInfo;
const nodes: MeshProcess[] = [];
let openai: OpenAI;
let llamaModel: LlamaModel;
let tokenizer: Tokenizer;
let chatTemplate: ChatTemplate;

/** What llama.cpp generates greedily for these prompt tokens, as text. */
async function expectedText(promptTokens: number[], n: number): Promise<string> {
  return tokenizer.decode(await greedyGenerate(llamaModel, promptTokens, n));
}

/** Raw SSE: the list of `data:` payloads (and `event:` names) of a streamed request. */
async function rawStream(path: string, body: unknown, stopAfter?: number): Promise<Array<{ event?: string; data: string }>> {
  const ctl = new AbortController();
  const res = await fetch(`${serve.base}${path}`, { method: 'POST', signal: ctl.signal, headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const out: Array<{ event?: string; data: string }> = [];
  const reader = res.body!.getReader();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += new TextDecoder().decode(value);
      let i: number;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const ev = /^event: (.*)$/m.exec(block)?.[1];
        const data = /^data: (.*)$/m.exec(block)?.[1] ?? '';
        out.push({ ...(ev ? { event: ev } : {}), data });
        if (stopAfter !== undefined && out.length >= stopAfter) {
          ctl.abort();
          return out;
        }
      }
    }
  } catch (e) {
    if (!ctl.signal.aborted) throw e;
  }
  return out;
}

beforeAll(async () => {
  const model = await stories260K();
  // no spare: a node killed mid-stream fails its session after 2 s of waiting for one, not 30
  serve = await spawnServe(model, ['--min-peers', '2', '--repair-timeout', '2000']);
  for (const name of ['a', 'b']) {
    const n = spawnMesh(['node', '--join', serve.joinUrl, '--name', name, '--no-cache']);
    await n.waitFor(/joined room/);
    nodes.push(n);
  }
  await waitForRoute(serve, 'ready');
  openai = new OpenAI({ apiKey: serve.secret, baseURL: `${serve.base}/v1`, maxRetries: 0 });
  llamaModel = await loadModel(model);
  const header = await readHeader(model);
  tokenizer = Tokenizer.fromMetadata(header.metadata);
  chatTemplate = ChatTemplate.fromMetadata(header.metadata, { tokenizer, fallback: true });
});

afterAll(async () => {
  await llamaModel?.dispose();
  await killAll();
});

describe('OpenAI-compatible API over a two-node route', () => {
  it('lists the model with its route status', async () => {
    const models = await openai.models.list();
    expect(models.data.map((m) => m.id)).toEqual(['stories260K']);
    expect((models.data[0] as unknown as { route_status: string }).route_status).toBe('ready');
  });

  it('completions: streamed deltas concatenate to the non-streamed text, which is llama.cpp\'s greedy continuation', async () => {
    const prompt = 'Once upon a time';
    const full = await openai.completions.create({ model: 'stories260K', prompt, max_tokens: 20, temperature: 0 });
    expect(full.choices[0]!.text).toBe(await expectedText(tokenizer.encode(prompt), 20));
    expect(full.usage).toMatchObject({ prompt_tokens: 5, completion_tokens: 20, total_tokens: 25 });
    expect(full.choices[0]!.finish_reason).toBe('length');
    const stream = await openai.completions.create({ model: 'stories260K', prompt, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage: unknown = null;
    for await (const c of stream) {
      text += c.choices[0]?.text ?? '';
      if (c.usage) usage = c.usage;
    }
    expect(text).toBe(full.choices[0]!.text);
    expect(usage).toMatchObject({ prompt_tokens: 5, completion_tokens: 20 });
  });

  it('chat: rendered with the model\'s template (ChatML fallback), streamed = non-streamed = llama.cpp', async () => {
    const messages = [{ role: 'user' as const, content: 'Tell me a story about a cat.' }];
    const promptTokens = tokenizer.encode(chatTemplate.prompt(tokenizer, messages));
    const full = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 16, temperature: 0 });
    expect(full.choices[0]!.message.content).toBe(await expectedText(promptTokens, 16));
    expect(full.usage).toMatchObject({ prompt_tokens: promptTokens.length, completion_tokens: 16 });
    const stream = await openai.chat.completions.create({ model: 'stories260K', messages, max_tokens: 16, temperature: 0, stream: true });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    expect(text).toBe(full.choices[0]!.message.content);
  });

  it('sampling at the last stage is reproducible with a seed', async () => {
    const ask = (seed: number) => openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 1, top_p: 0.9, seed });
    const [a, b, c] = [await ask(42), await ask(42), await ask(7)];
    expect(a.choices[0]!.text).toBe(b.choices[0]!.text);
    expect(a.choices[0]!.text).not.toBe(c.choices[0]!.text);
  });

  it('a stop string ends the text before it', async () => {
    const r = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stop: ['Lily'] });
    expect(r.choices[0]!.text).toBe(', there was a little girl named ');
    expect(r.choices[0]!.finish_reason).toBe('stop');
  });

  it('progress (route, prefill) arrives before the first token; the session has an event stream', async () => {
    // cache_prompt: false: the session closes at the end (a kept one would stay open for the next turn, and its event stream with it)
    const events = await rawStream('/v1/chat/completions', { model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0, stream: true, cache_prompt: false });
    const parsed = events.filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data));
    const firstText = parsed.findIndex((c) => c.choices[0]?.delta?.content);
    const kinds = parsed.slice(0, firstText).map((c) => c.gguf_mesh?.type).filter(Boolean);
    expect(kinds).toContain('route_planned');
    expect(kinds).toContain('prefill_progress');
    // each content chunk carries the per-stage breakdown of its step (the 2nd: a decode step)
    const step = parsed.filter((c) => c.choices[0]?.delta?.content)[1].gguf_mesh;
    expect(step.type).toBe('step_timing');
    expect(step.stages.map((x: any) => x.stage)).toEqual([0, 1]);
    expect(step.stages[0].computeMs).toBeGreaterThan(0);
    expect(step.stages[0].bytesOut).toBe(52 + 64 * 2);
    const summary = parsed.at(-1).gguf_mesh;
    expect(summary.type).toBe('session_summary');
    expect(summary.stages).toHaveLength(2);
    expect(summary.stages[0].bytesOut).toBeGreaterThan(0);
    expect(events.at(-1)!.data).toBe('[DONE]');
    // the finished session's telemetry, replayed as SSE
    const sid = summary.sessionId as string;
    const res = await fetch(`${serve.base}/v1/sessions/${sid}/events`, { headers: { authorization: `Bearer ${serve.secret}` } });
    const text = await res.text();
    expect(text).toContain('event: prefill_progress');
    expect(text).toContain('event: token');
    expect(text).toContain('"state":"closed"');
  });

  it('a client that disconnects mid-stream cancels the session and frees every stage', async () => {
    const events = await rawStream('/v1/completions', { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 400, temperature: 0, stream: true }, 6);
    const sid = events.map((e) => JSON.parse(e.data).gguf_mesh?.sessionId).find(Boolean) as string;
    expect(sid).toMatch(/^[0-9a-f]{32}$/);
    let info: any;
    for (let i = 0; i < 50; i++) {
      info = (await getJson(`${serve.base}/v1/sessions/${sid}`, serve.secret)).body;
      if (info.state === 'closed') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(info.state).toBe('closed');
    expect(info.generatedTokens).toBeLessThan(400);
    for (const st of info.stages) expect(st.kvBytes).toBe(0);
  });

  it('a wrong key is refused', async () => {
    const bad = new OpenAI({ apiKey: 'nope', baseURL: `${serve.base}/v1`, maxRetries: 0 });
    await expect(bad.models.list()).rejects.toMatchObject({ status: 401 });
  });

  it('every streamed event carries id <completion id>:<text offset>; without --redis a Last-Event-ID is refused by name', async () => {
    const body = JSON.stringify({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 12, temperature: 0, stream: true });
    const post = (lastEventId?: string): Promise<Response> =>
      fetch(`${serve.base}/v1/completions`, { method: 'POST', headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json', ...(lastEventId ? { 'last-event-id': lastEventId } : {}) }, body });
    let text = '';
    const ids: string[] = [];
    await readSse(await post(), ({ data, id }) => {
      ids.push(id ?? '(none)');
      if (data && data !== '[DONE]') text += JSON.parse(data).choices?.[0]?.text ?? '';
      expect(id, data).toMatch(/^cmpl-[0-9a-f]{24}:\d+$/);
      expect(Number(id!.split(':')[1])).toBe(text.length); // the client's text once it read this event
    });
    expect(text.length).toBeGreaterThan(0);
    expect(new Set(ids.map((i) => i.split(':')[0])).size).toBe(1);
    const unknown = await post(ids.at(-1));
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as any).error.code).toBe('RESUME_UNKNOWN');
    const bad = await post('not-an-id');
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as any).error.code).toBe('RESUME_BAD_EVENT_ID');
  });

  it('a body over 4 MiB is BODY_TOO_LARGE (413), one that is not a JSON object a named 400, and the API goes on', async () => {
    const post = (body: string): Promise<Response> =>
      fetch(`${serve.base}/v1/completions`, { method: 'POST', headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json' }, body });
    const huge = await post(JSON.stringify({ model: 'stories260K', prompt: 'x'.repeat(5 * 1024 * 1024) }));
    expect(huge.status).toBe(413);
    expect(((await huge.json()) as any).error).toMatchObject({ code: 'BODY_TOO_LARGE', limitBytes: 4 * 1024 * 1024 });
    const broken = await post('{"model": "stories260K", "prompt": ');
    expect(broken.status).toBe(400);
    expect(((await broken.json()) as any).error.code).toBe('BODY_NOT_JSON');
    const notObject = await post('null');
    expect(notObject.status).toBe(400);
    expect(((await notObject.json()) as any).error.code).toBe('BAD_REQUEST');
    const ok = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 2, temperature: 0 });
    expect(ok.usage?.completion_tokens).toBe(2);
  });

  it('a node killed mid-stream produces an error event naming its stage', async () => {
    const stream = await openai.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 2000, temperature: 1, seed: 3, stream: true });
    let n = 0;
    let error: any = null;
    try {
      for await (const c of stream) {
        if (c.choices[0]?.text) n++;
        if (n === 3) void nodes[1]!.kill('SIGKILL');
      }
    } catch (e) {
      error = e;
    }
    expect(error).not.toBeNull();
    expect(String(error?.message ?? error)).toMatch(/stage 1/);
    expect(error.error?.stage ?? error.stage ?? 1).toBe(1);
  });
});
