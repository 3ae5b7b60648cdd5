// `npm run bench -- speculate [--rounds 2] [--delay 20] [--drafts 4] [--tokens 96]`: speculative
// decoding over a slow route (issue 18). serve + 3 CPU nodes on stories260K, each node's links
// delayed `delay` ms each way (`node --test-link-delay-ms`: 2 × delay of round trip per hop),
// a greedy streamed completion of a repetitive prompt, decoded with `speculate: 0` and with
// `speculate: drafts`, rounds interleaved. Reports decode tokens/s (first streamed token → end),
// the acceptance rate and tokens per route pass from the session summary, and that both texts
// are the same. Goal: ≥ 1.5× tokens/s with speculation.
import { stories260K } from '../test/support/models.ts';
import { finishLoad, goal, machineLoad, round2 } from './lib/goals.ts';
import { numberArg } from './lib/serve-route.ts';
import { readSseJson } from './lib/sse.ts';
import { killAllCli, spawnCli } from './processes.ts';

const PROMPT = 'Tom said, "I like the red ball. I like the red ball. I like the red ball." Lily said, "I like the red ball. I like the red ball.';

interface Run {
  text: string;
  decodeTokS: number;
  speculation: { passes: number; tokens: number; proposed: number; accepted: number } | null;
}

async function complete(base: string, secret: string, maxTokens: number, speculate: number): Promise<Run> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'stories260K', prompt: PROMPT, max_tokens: maxTokens, temperature: 0, stream: true, speculate, cache_prompt: false }),
  });
  let text = '';
  let first = 0;
  let tokens = 0;
  let speculation: Run['speculation'] = null;
  await readSseJson(res, (c) => {
    const piece = c.choices?.[0]?.text;
    if (piece) {
      if (!first) first = performance.now();
      text += piece;
    }
    if (c.gguf_mesh?.type === 'session_summary') {
      tokens = c.gguf_mesh.generatedTokens;
      speculation = c.gguf_mesh.speculation ?? null;
    }
  });
  const end = performance.now();
  if (!first) throw new Error(`no text after ${(end - t0).toFixed(0)} ms`);
  return { text, decodeTokS: (tokens - 1) / ((end - first) / 1000), speculation };
}

export async function run(args: string[]): Promise<unknown> {
  const rounds = numberArg(args, 'rounds', 2);
  const delay = numberArg(args, 'delay', 20);
  const drafts = numberArg(args, 'drafts', 4);
  const maxTokens = numberArg(args, 'tokens', 96);
  const load = machineLoad();
  const serve = spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', await stories260K(), '--min-peers', '3', '--standby', 'off']);
  try {
    const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/);
    const [, secret] = await serve.waitFor(/secret:\s+(\S+)/);
    const base = new URL(joinUrl!).origin;
    for (const [i, layers] of ['0-2', '2-4', '4-5'].entries()) {
      await spawnCli(['node', '--join', joinUrl!, '--backend', 'cpu', '--no-cache', '--memory', '1GiB', '--name', `s${i}`, '--layers', layers, '--test-link-delay-ms', String(delay)]).waitFor(/joined room/);
    }
    for (let i = 0; i < 600; i++) {
      const m = (await (await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${secret}` } })).json()) as { data: Array<{ route_status: string }> };
      if (m.data[0]?.route_status === 'ready') break;
      await new Promise((r) => setTimeout(r, 200));
    }
    await complete(base, secret!, 8, 0); // warm-up
    const plain: Run[] = [];
    const spec: Run[] = [];
    for (let r = 0; r < rounds; r++) {
      plain.push(await complete(base, secret!, maxTokens, 0));
      spec.push(await complete(base, secret!, maxTokens, drafts));
    }
    const best = (xs: Run[]): number => Math.max(...xs.map((x) => x.decodeTokS));
    const s = spec.at(-1)!.speculation;
    const ratio = best(spec) / best(plain);
    const identical = [...plain, ...spec].every((x) => x.text === plain[0]!.text);
    return {
      bench: 'speculate',
      route: '3 CPU stages (stories260K: 0-2, 2-4, 4-5)',
      addedRttMsPerHop: 2 * delay,
      drafts,
      tokens: maxTokens,
      decodeTokS: { plain: plain.map((x) => round2(x.decodeTokS)), speculative: spec.map((x) => round2(x.decodeTokS)) },
      speculation: s ? { ...s, acceptance: round2(s.accepted / Math.max(1, s.proposed)), tokensPerPass: round2(s.tokens / Math.max(1, s.passes)) } : null,
      identicalText: identical,
      ratio: round2(ratio),
      goals: [goal('speculative / plain decode tokens/s at 2 × delay of round trip per hop', ratio, 'min', 1.5), goal('speculative text = plain greedy text', identical ? 1 : 0, 'min', 1)],
      load: finishLoad(load),
    };
  } finally {
    killAllCli();
  }
}
