// Probes of starvation and memory (issue 16): prompts past the context, a long prefill beside a
// short request, a client that leaves mid-prefill, session and fragment floods, and overload.

import WebSocket from 'ws';
import { FrameFlag, FrameType } from '../../src/protocol/frame.ts';
import { jsonFrame, tokensFrame } from '../../src/protocol/payload.ts';
import { newSessionId } from '../../src/protocol/session.ts';
import { WsLink } from '../../src/transport/ws.ts';
import { floodFragments } from '../../test/hardening/fragment-flood.ts';
import { cpuMs, getJson, node, rssMiB, serve, sleep, waitReady } from './procs.ts';
import type { Proc, Served } from './procs.ts';

const STORY = 'Once upon a time there was a little girl named Lily. ';

async function completion(s: Served, prompt: string, maxTokens: number, signal?: AbortSignal): Promise<{ status: number; ms: number; body: any; headers: Headers }> {
  const t0 = performance.now();
  const res = await fetch(`${s.base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
    ...(signal ? { signal } : {}),
  });
  const body = await res.json().catch(() => null);
  return { status: res.status, ms: performance.now() - t0, body, headers: res.headers };
}

function clientLink(s: Served): Promise<WsLink> {
  return WsLink.connect(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${s.secret}` } });
}

async function withRoute<T>(root: string, model: string, extra: string[], body: (s: Served, nodes: Proc[], routeId: number) => Promise<T>): Promise<T> {
  const s = await serve(root, model, extra);
  const nodes = [await node(root, s)];
  try {
    return await body(s, nodes, await waitReady(s));
  } finally {
    for (const n of nodes) await n.kill();
    await s.proc.kill();
  }
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** A prompt past the model's context (2,048), and a session that declares a context of 10⁹. */
export function contextLimits(root: string, model: string): Promise<Record<string, unknown>> {
  return withRoute(root, model, [], async (s, _n, routeId) => {
    const long = STORY.repeat(200); // ≈ 2,400 tokens
    const r = await completion(s, long, 1);
    const link = await clientLink(s);
    const open = await link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: newSessionId() }, { contextLength: 1e9 })).then(() => 'accepted', (e: Error) => e.message.slice(0, 120));
    const sid = newSessionId();
    await link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: sid }, { contextLength: 2048 }));
    const tokens = Array.from({ length: 4096 }, (_, i) => 3 + (i % 500));
    const t0 = performance.now();
    const big = await link.request(tokensFrame(FrameType.Prefill, { routeId, sessionId: sid }, 0, tokens, FrameFlag.Sample)).then(() => `accepted (${Math.round(performance.now() - t0)} ms)`, (e: Error) => e.message.slice(0, 120));
    await link.close();
    return { 'prompt of ~2,400 tokens on a 2,048 context': `${r.status} ${r.body?.usage ? `prompt_tokens ${r.body.usage.prompt_tokens}` : (r.body?.error?.code ?? '')}`, 'session contextLength 1e9': open, 'one 4,096-token prefill frame': big };
  });
}

/** A streamed completion: time to the first token, the longest gap between tokens, the total (ms). */
async function streamed(s: Served, prompt: string, maxTokens: number): Promise<{ ttft: number; maxGap: number; total: number }> {
  const t0 = performance.now();
  const res = await fetch(`${s.base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true }),
  });
  const reader = res.body!.getReader();
  const times: number[] = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const n = (new TextDecoder().decode(value).match(/"text":"[^"]/g) ?? []).length;
    for (let i = 0; i < n; i++) times.push(performance.now() - t0);
  }
  const gaps = times.slice(1).map((t, i) => t - times[i]!);
  return { ttft: Math.round(times[0] ?? NaN), maxGap: Math.round(Math.max(0, ...gaps)), total: Math.round(performance.now() - t0) };
}

/** A short completion's wall time idle, then beside a 2,000-token prefill sent by another client. */
export function starvation(root: string, model: string): Promise<Record<string, unknown>> {
  return withRoute(root, model, [], async (s, _n, routeId) => {
    const short = 'Once upon a time';
    await completion(s, short, 32);
    const idle: number[] = [];
    for (let i = 0; i < 3; i++) idle.push((await completion(s, short, 32)).ms);
    const link = await clientLink(s);
    const sid = newSessionId();
    await link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: sid }, { contextLength: 2048 }));
    const tokens = Array.from({ length: 2000 }, (_, i) => 3 + (i % 500));
    const t0 = performance.now();
    // the largest frame the server takes: one frame, else chunks of its cap
    const long = (async () => {
      let at = 0;
      let chunk = tokens.length;
      while (at < tokens.length) {
        const part = tokens.slice(at, at + chunk);
        try {
          await link.request(tokensFrame(FrameType.Prefill, { routeId, sessionId: sid }, at, part, at + part.length >= tokens.length ? FrameFlag.Sample : 0));
          at += part.length;
        } catch (e) {
          const cap = Number((e as { details?: { limit?: number } }).details?.limit ?? /at most (\d+)/.exec((e as Error).message)?.[1]);
          if (!(cap > 0 && cap < chunk)) throw e;
          chunk = cap;
        }
      }
      return performance.now() - t0;
    })().catch((e: Error) => {
      throw e;
    });
    long.catch(() => undefined); // awaited below; not an unhandled rejection meanwhile
    await sleep(300);
    // the first short request starts while the long prefill runs (the ones after may not)
    const during = await streamed(s, short, 32);
    const longMs = await long;
    const idleStream = await streamed(s, short, 32);
    await link.close();
    return {
      idleMs: Math.round(median(idle)),
      besideLongPrefillMs: during.total,
      ttftIdleMs: idleStream.ttft,
      ttftBesideMs: during.ttft,
      maxTokenGapIdleMs: idleStream.maxGap,
      maxTokenGapBesideMs: during.maxGap,
      longPrefillMs: Math.round(longMs),
      ratio: Math.round((during.total / median(idle)) * 10) / 10,
    };
  });
}

/** A streamed completion with a 2,000-token prompt whose client leaves after 300 ms: how long the node keeps computing. */
export function disconnect(root: string, model: string): Promise<Record<string, unknown>> {
  return withRoute(root, model, [], async (s, nodes) => {
    const peers = (await getJson(`${s.base}/v1/rooms/${s.roomId}/peers`, s.secret)).body.peers as Array<{ httpUrl: string }>;
    const nodeUrl = peers[0]!.httpUrl;
    const ctl = new AbortController();
    const req = fetch(`${s.base}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: STORY.repeat(160), max_tokens: 4, stream: true }),
      signal: ctl.signal,
    }).catch(() => null);
    await sleep(300);
    ctl.abort();
    await req;
    const left = performance.now();
    const pid = nodes[0]!.child.pid!;
    const cpu0 = cpuMs(pid);
    let stillOpenMs = 0;
    for (;;) {
      const st = await getJson(`${nodeUrl}/v1/status`, s.secret);
      if (!(st.body.sessions?.length > 0) || performance.now() - left > 60_000) break;
      stillOpenMs = performance.now() - left;
      await sleep(50);
    }
    await sleep(1000);
    return { sessionOpenOnNodeAfterLeaveMs: Math.round(stillOpenMs), nodeCpuMsInTheSecondsAfter: Math.round(cpuMs(pid) - cpu0), windowMs: Math.round(performance.now() - left) };
  });
}

/** 1,000 session opens from one client; then 16 fragments each announcing a 256 MiB frame. */
export function floods(root: string, model: string): Promise<Record<string, unknown>> {
  return withRoute(root, model, [], async (s, nodes, routeId) => {
    const link = await clientLink(s);
    const t0 = performance.now();
    let opened = 0;
    let refusal = '';
    const ids: string[] = [];
    for (let i = 0; i < 1000; i++) {
      const sid = newSessionId();
      try {
        await link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: sid }, { contextLength: 2048 }));
        opened++;
        ids.push(sid);
      } catch (e) {
        refusal ||= `${(e as Error).message.slice(0, 100)}`;
      }
    }
    const openMs = performance.now() - t0;
    const peers = (await getJson(`${s.base}/v1/rooms/${s.roomId}/peers`, s.secret)).body.peers as Array<{ httpUrl: string }>;
    const st = (await getJson(`${peers[0]!.httpUrl}/v1/status`, s.secret)).body as { sessions?: Array<{ kvBytes: number }> };
    const nodeRss = rssMiB(nodes[0]!.child.pid!);
    await link.close();
    await sleep(500);
    // fragment reservations: 16 messages, each announcing a 256 MiB frame and sending 16 MiB of it, then silence
    const rss0 = rssMiB(s.proc.child.pid!);
    const ws = new WebSocket(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${s.secret}` } });
    await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
    floodFragments(ws);
    await sleep(2000);
    const rss1 = rssMiB(s.proc.child.pid!);
    const socketOpen = ws.readyState === ws.OPEN;
    await sleep(35_000);
    const rss2 = rssMiB(s.proc.child.pid!);
    ws.terminate();
    return {
      sessionsOpened: opened,
      openMs: Math.round(openMs),
      refusal: refusal || null,
      nodeSessions: st.sessions?.length ?? 0,
      nodeKvMiB: Math.round((st.sessions ?? []).reduce((a, x) => a + x.kvBytes, 0) / 2 ** 20),
      nodeRssMiB: nodeRss,
      serverRssBeforeFragmentsMiB: rss0,
      serverRssAfterFragmentsMiB: rss1,
      serverRss35sLaterMiB: rss2,
      fragmentSocketStillOpen: socketOpen,
    };
  });
}

/** 200 completions at once: statuses, Retry-After, wall time. */
export function overload(root: string, model: string): Promise<Record<string, unknown>> {
  return withRoute(root, model, [], async (s) => {
    const t0 = performance.now();
    const all = await Promise.all(Array.from({ length: 200 }, () => completion(s, 'Once upon a time', 16)));
    const statuses: Record<string, number> = {};
    for (const r of all) statuses[r.status] = (statuses[r.status] ?? 0) + 1;
    const ok = all.filter((r) => r.status === 200).map((r) => r.ms);
    return {
      statuses,
      retryAfter: all.find((r) => r.status === 429)?.headers.get('retry-after') ?? null,
      wallMs: Math.round(performance.now() - t0),
      slowestOkMs: ok.length ? Math.round(Math.max(...ok)) : null,
    };
  });
}
