// `npm run bench -- serve [--turns 5] [--words 48] [--reply 24] [--layers 8 --embd 512 --ffn 1536 --vocab 4096]`:
// the OpenAI API as a chat client uses it, on `serve` + a two-node CPU route over a synthetic
// model: a conversation of `turns` turns (each user message `words` words, each reply `reply`
// tokens, greedy), streamed, run twice in the same processes — with KV reuse across turns
// (cache_prompt, the default) and without (cache_prompt: false) — reporting each turn's time to
// first token and the tokens it prefilled. Goal (issue 22): turn-5 TTFT with reuse ≤ 1.2× turn 1's.
// Then, in the same processes, part (b) (./batch.ts): aggregate decode tok/s at 1, 8 and 32
// concurrent sessions, batched on each stage. Goal: at 32 ≥ 5× one session's.
import { batchedDecode } from './batch.ts';
import { goal } from './lib/goals.ts';
import { WORDS, numberArg, round, startServeRoute, shapeFrom } from './lib/serve-route.ts';
import { readSseJson } from './lib/sse.ts';
import { killAllCli } from './processes.ts';


interface Turn {
  turn: number;
  promptTokens: number;
  cachedTokens: number;
  prefilledTokens: number;
  /** time to first token as the server measures it (session summary: prefill of what the KV lacks → the first token sampled) */
  ttftMs: number;
  /** request sent → first text (or the end) streamed back; a token whose text is held back (a partial UTF-8 byte, a stop-string prefix) delays it */
  clientFirstTextMs: number;
}

/** One streamed chat request: time to the first content chunk, the reply, and usage. */
async function ask(base: string, secret: string, body: Record<string, unknown>): Promise<{ ttftMs: number; serverPrefillMs: number; text: string; usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } } }> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  let ttftMs = -1;
  let serverPrefillMs = -1;
  let text = '';
  let usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } } | null = null;
  await readSseJson(res, (c) => {
    const piece = c.choices?.[0]?.delta?.content;
    // the first token: a content chunk, or the end (a reply whose first token was EOG or has no text)
    if ((piece || c.choices?.[0]?.finish_reason) && ttftMs < 0) ttftMs = performance.now() - t0;
    if (c.gguf_mesh?.type === 'session_summary') serverPrefillMs = c.gguf_mesh.timeToFirstTokenMs;
    text += piece ?? '';
    if (c.usage) usage = c.usage;
  });
  if (!usage) throw new Error('the stream ended without usage');
  return { ttftMs, serverPrefillMs, text, usage };
}

async function conversation(base: string, secret: string, model: string, turns: number, words: number, reply: number, reuse: boolean, seed: number): Promise<Turn[]> {
  const messages: Array<{ role: string; content: string }> = [];
  const out: Turn[] = [];
  for (let t = 1; t <= turns; t++) {
    messages.push({ role: 'user', content: Array.from({ length: words }, (_, i) => WORDS[(i * 7 + t * 3 + seed) % WORDS.length]).join(' ') });
    const r = await ask(base, secret, { model, messages, max_tokens: reply, temperature: 0, cache_prompt: reuse });
    messages.push({ role: 'assistant', content: r.text });
    const cached = r.usage.prompt_tokens_details?.cached_tokens ?? 0;
    out.push({ turn: t, promptTokens: r.usage.prompt_tokens, cachedTokens: cached, prefilledTokens: r.usage.prompt_tokens - cached, ttftMs: round(r.serverPrefillMs), clientFirstTextMs: round(r.ttftMs) });
  }
  return out;
}

export async function run(args: string[]): Promise<unknown> {
  const shape = shapeFrom(args);
  const turns = numberArg(args, 'turns', 5);
  const words = numberArg(args, 'words', 48);
  const reply = numberArg(args, 'reply', 24);
  try {
    const route = await startServeRoute(shape);
    const { base, secret, model, path } = route;
    await conversation(base, secret, model, 1, 8, 2, false, 99); // warm-up: shaders of nothing, JIT and sockets
    // each run its own words, so the reuse run cannot match the other's kept sessions
    const without = await conversation(base, secret, model, turns, words, reply, false, 1);
    const withReuse = await conversation(base, secret, model, turns, words, reply, true, 2);
    const at = (r: Turn[], t: number): Turn => r[Math.min(t, r.length) - 1]!;
    // part (b), in the same processes: aggregate decode at 1, 8 and 32 concurrent sessions
    const batched = await batchedDecode(route);
    return {
      bench: 'serve',
      model: { ...shape, path },
      conversation: { turns, wordsPerMessage: words, replyTokens: reply, route: '2 CPU nodes (node processes) + serve, loopback' },
      without,
      with: withReuse,
      figures: {
        turn1TtftMs: { without: at(without, 1).ttftMs, with: at(withReuse, 1).ttftMs },
        turn2TtftMs: { without: at(without, 2).ttftMs, with: at(withReuse, 2).ttftMs },
        turn5TtftMs: { without: at(without, 5).ttftMs, with: at(withReuse, 5).ttftMs },
        turn5ClientFirstTextMs: { without: at(without, 5).clientFirstTextMs, with: at(withReuse, 5).clientFirstTextMs },
        turn5PrefilledTokens: { without: at(without, 5).prefilledTokens, with: at(withReuse, 5).prefilledTokens },
      },
      ratios: {
        turn5OverTurn1WithReuse: round(at(withReuse, 5).ttftMs / at(withReuse, 1).ttftMs, 2),
        turn5OverTurn1Without: round(at(without, 5).ttftMs / at(without, 1).ttftMs, 2),
        turn5SpeedupFromReuse: round(at(without, 5).ttftMs / at(withReuse, 5).ttftMs, 2),
        goal: 'turn5OverTurn1WithReuse ≤ 1.2',
      },
      batchedDecode: { levels: batched.levels, ratio: batched.ratio },
      goals: [goal('turn-5 TTFT with reuse / turn 1', at(withReuse, 5).ttftMs / at(withReuse, 1).ttftMs, 'max', 1.2), batched.goal],
    };
  } finally {
    killAllCli();
  }
}
