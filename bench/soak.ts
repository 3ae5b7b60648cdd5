// `npm run bench -- soak [--minutes 20] [--model <gguf>] [--clients 6]`: mixed load on a real
// serve and two cpu nodes (loopback only) — completions, streams, streams cancelled after their
// first token, bursts past the admission queue, and a third node joining and leaving every 20 s —
// sampling the RSS of the server and every node. It reports whether RSS stayed flat (the last
// fifth of the run against the fifth after warm-up, within 10 %), that every request completed,
// was cancelled by its client or answered 429, and that no session is left on the server or a
// node at the end.

import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { getJson, node, rssMiB, serve, sleep, waitReady } from './probe/procs.ts';
import type { Proc, Served } from './probe/procs.ts';

const here = dirname(fileURLToPath(import.meta.url));
const PROMPT = 'Once upon a time';

interface Tally {
  completed: number;
  streamed: number;
  cancelled: number;
  rejected429: number;
  errors: Record<string, number>;
}

async function request(s: Served, t: Tally, kind: 'complete' | 'stream' | 'cancel'): Promise<void> {
  const ctl = new AbortController();
  try {
    const res = await fetch(`${s.base}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: PROMPT, max_tokens: 16 + Math.floor(Math.random() * 16), temperature: 0.8, stream: kind !== 'complete' }),
      signal: ctl.signal,
    });
    if (res.status === 429) {
      t.rejected429++;
      return void (await res.body?.cancel());
    }
    if (res.status !== 200) {
      const code = ((await res.json().catch(() => ({}))) as { error?: { code?: string } }).error?.code ?? String(res.status);
      t.errors[code] = (t.errors[code] ?? 0) + 1;
      return;
    }
    if (kind === 'complete') {
      await res.json();
      t.completed++;
      return;
    }
    const reader = res.body!.getReader();
    let text = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
      if (kind === 'cancel' && /"text":"[^"]/.test(text)) {
        ctl.abort();
        t.cancelled++;
        return;
      }
    }
    if (/event: error/.test(text)) t.errors.stream_error = (t.errors.stream_error ?? 0) + 1;
    else t.streamed++;
  } catch (e) {
    if (ctl.signal.aborted) return;
    t.errors[(e as Error).name] = (t.errors[(e as Error).name] ?? 0) + 1;
  }
}

/** One client: requests back to back, now and then a burst of ten at once (past the queue: 429s). */
async function client(s: Served, t: Tally, until: number): Promise<void> {
  while (Date.now() < until) {
    const r = Math.random();
    if (r < 0.05) await Promise.all(Array.from({ length: 10 }, () => request(s, t, 'complete')));
    else await request(s, t, r < 0.45 ? 'complete' : r < 0.8 ? 'stream' : 'cancel');
  }
}

/** A third node joins, stays a few seconds and leaves, every `everyMs`. */
async function churn(root: string, s: Served, until: number, everyMs: number): Promise<number> {
  let joins = 0;
  while (Date.now() + everyMs < until) {
    await sleep(everyMs - 5000);
    const extra = await node(root, s, ['--name', `visitor-${joins}`]).catch(() => null);
    if (extra) joins++;
    await sleep(5000);
    await extra?.kill();
  }
  return joins;
}

const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

/** RSS flat: the last fifth of the samples against the fifth after warm-up (the first fifth). */
function flatness(samples: number[]): { first: number; last: number; max: number; ratio: number; flat: boolean } {
  const k = Math.max(1, Math.floor(samples.length / 5));
  const first = mean(samples.slice(k, 2 * k));
  const last = mean(samples.slice(-k));
  const ratio = Math.round((last / first) * 1000) / 1000;
  return { first: Math.round(first), last: Math.round(last), max: Math.max(...samples), ratio, flat: Math.abs(ratio - 1) <= 0.1 };
}

export async function run(args: string[]): Promise<unknown> {
  const opt = (name: string, fallback: string): string => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1]! : fallback;
  };
  const root = resolve(here, '..');
  const model = resolve(opt('model', join(here, '..', '..', 'shared', 'models', 'stories260K.gguf')));
  if (!existsSync(model)) throw new Error(`no model at ${model} (pass --model)`);
  const minutes = Number(opt('minutes', '20'));
  const clients = Number(opt('clients', '6'));
  const s = await serve(root, model, ['--max-active', '4', '--max-queue', '8', '--min-peers', '2']);
  const nodes: Proc[] = [await node(root, s, ['--layers', '0-3', '--name', 'front']), await node(root, s, ['--layers', '3-5', '--name', 'back'])];
  await waitReady(s);
  const t: Tally = { completed: 0, streamed: 0, cancelled: 0, rejected429: 0, errors: {} };
  const started = Date.now();
  const until = started + minutes * 60_000;
  const rss: { server: number[]; nodes: number[][] } = { server: [], nodes: nodes.map(() => []) };
  const sampler = setInterval(() => {
    rss.server.push(rssMiB(s.proc.child.pid!));
    nodes.forEach((n, i) => rss.nodes[i]!.push(rssMiB(n.child.pid!)));
  }, Math.min(5000, (minutes * 60_000) / 40));
  const [joins] = await Promise.all([churn(root, s, until, 20_000), ...Array.from({ length: clients }, () => client(s, t, until))]);
  clearInterval(sampler);
  await sleep(1500); // cancelled sessions close on every stage
  const health = (await getJson(`${s.base}/v1/health`, s.secret)).body as { sessions: number; queue: unknown };
  const peers = (await getJson(`${s.base}/v1/rooms/${s.roomId}/peers`, s.secret)).body.peers as Array<{ name?: string; httpUrl?: string }>;
  const nodeSessions = await Promise.all(peers.filter((p) => p.httpUrl).map(async (p) => ({ name: p.name, sessions: ((await getJson(`${p.httpUrl}/v1/status`, s.secret)).body.sessions ?? []).length })));
  for (const n of nodes) await n.kill();
  await s.proc.kill();
  const requests = t.completed + t.streamed + t.cancelled + t.rejected429 + Object.values(t.errors).reduce((a, b) => a + b, 0);
  return {
    bench: 'soak',
    minutes,
    clients,
    durationS: Math.round((Date.now() - started) / 1000),
    requests: { total: requests, ...t, perSecond: Math.round((requests / ((Date.now() - started) / 1000)) * 10) / 10 },
    everyRequestCompletedOr429: Object.keys(t.errors).length === 0,
    visitorNodesJoinedAndLeft: joins,
    rssMiB: { samples: rss.server.length, server: flatness(rss.server), nodes: rss.nodes.map(flatness) },
    sessionsLeft: { server: health.sessions, nodes: nodeSessions },
    queueAtEnd: health.queue,
  };
}
