// The floor under a route of processes on this machine: the same topology as `serve` + 3 `node`
// processes and a client, with nothing in it but `ws` sockets and three stages that each stay busy
// for `stageMs` (a spin standing for a stage's forward pass) — no frames, no engine threads, no
// sessions. A lap of it is the least any implementation of that topology in Node over WebSockets
// can take here, so `stageMs × 3 / lap` bounds the decode ratio a route can reach against one
// process whose forward pass costs the stages' sum. Two topologies:
// - `route`: what runs today — client → server → stage 0 → 1 → 2 → server → client (6 messages);
// - `ring`: the last stage hands the token straight to stage 0 (3 messages per token; the server
//   and the client hear of it off the path), the lever left for loopback routes.
// On a virtual machine with two vCPUs every message wakes a sleeping process, at ~0.1–0.25 ms each.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { WebSocket, WebSocketServer } from 'ws';
import { median } from '../../src/stats.ts';

// A relay: forwards each message to `next` (argv[2], or '-' for none) after `spin` ms of work
// (argv[1]). Byte 0 says where a message goes at a server-like relay: 0 onward, 1 back to the
// client (argv[3], the back address, where given); a stage marks what it forwards 1. A text
// message "next <url>" sets the onward address (the server's is known only once stage 0 is up).
const RELAY = `
const { WebSocket, WebSocketServer } = require('ws');
const [spinMs, nextUrl, backUrl] = [Number(process.argv[1]), process.argv[2], process.argv[3]];
const open = (u) => (u && u !== '-' ? new WebSocket(u, { perMessageDeflate: false }) : null);
let next = open(nextUrl);
const back = open(backUrl), notify = open(process.argv[4]);
const wss = new WebSocketServer({ port: 0, host: '127.0.0.1', perMessageDeflate: false }, () => console.log(wss.address().port));
wss.on('connection', (s) => s.on('message', (d, binary) => {
  if (!binary) return void (next = open(d.toString().slice(5)));
  if (spinMs > 0) { const t = performance.now(); while (performance.now() - t < spinMs); }
  if (back && d[0] === 1) return back.send(d);
  if (!back) d[0] = 1;
  next.send(d);
  if (notify) notify.send(d);
}));`;

export interface HandoffLap {
  messages_per_token: number;
  /** median lap: one token's way through the topology (ms) */
  lap_ms: number;
  /** the lap less the three stages' busy time: what the hand-offs alone cost (ms) */
  handoff_ms: number;
  /** 3 × stage_ms / lap: the best decode ratio against one process this topology allows here */
  best_ratio: number;
}

export interface HandoffFloor {
  stage_ms: number;
  laps: number;
  route: HandoffLap;
  ring: HandoffLap;
}

async function relay(spinMs: number, next: string, back = '-', notify = '-'): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ['-e', RELAY, String(spinMs), next, back, notify], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<string>((resolve, reject) => {
    child.stdout!.once('data', (d: Buffer) => resolve(d.toString().trim()));
    child.once('exit', (code) => reject(new Error(`handoff relay exited with ${code}`)));
  });
  return { child, url: `ws://127.0.0.1:${port}` };
}

/** A sink in this process: resolves `arrived` on every message. */
async function sink(): Promise<{ url: string; wss: WebSocketServer; next(): Promise<void> }> {
  const wss = new WebSocketServer({ port: 0, host: '127.0.0.1', perMessageDeflate: false });
  await new Promise<void>((r) => wss.once('listening', r));
  let waiting: (() => void) | null = null;
  wss.on('connection', (s) => s.on('message', () => waiting?.()));
  return { url: `ws://127.0.0.1:${(wss.address() as { port: number }).port}`, wss, next: () => new Promise<void>((r) => (waiting = r)) };
}

async function connect(url: string): Promise<WebSocket> {
  const ws = new WebSocket(url, { perMessageDeflate: false });
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  return ws;
}

const spin = (ms: number): void => {
  const t = performance.now();
  while (performance.now() - t < ms);
};
const r3 = (x: number): number => Math.round(x * 1000) / 1000;

async function laps(n: number, stageMs: number, messages: number, lap: () => Promise<void>): Promise<HandoffLap> {
  for (let i = 0; i < 20; i++) await lap(); // warm: JIT, sockets
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await lap();
    times.push(performance.now() - t0);
  }
  const m = median(times);
  return { messages_per_token: messages, lap_ms: r3(m), handoff_ms: r3(m - 3 * stageMs), best_ratio: r3((3 * stageMs) / m) };
}

/** The route's and the ring's lap here, each stage busy `stageMs` per token (the single process's step / 3). */
export async function handoffFloor(stageMs: number, n = 200): Promise<HandoffFloor> {
  const kids: ChildProcess[] = [];
  const sockets: WebSocket[] = [];
  const sinks: WebSocketServer[] = [];
  const settle = (): Promise<void> => new Promise((r) => setTimeout(r, 300)); // relays' onward sockets open
  try {
    // route: client → server → s0 → s1 → s2 → server → client, the server one process both ways
    const client = await sink();
    sinks.push(client.wss);
    const serve = await relay(0, '-', client.url);
    kids.push(serve.child);
    let next = serve.url;
    for (let k = 2; k >= 0; k--) {
      const s = await relay(stageMs, next);
      kids.push(s.child);
      next = s.url;
    }
    const toServe = await connect(serve.url);
    sockets.push(toServe);
    toServe.send(`next ${next}`);
    await settle();
    const msg = Buffer.alloc(HIDDEN_BYTES);
    const route = await laps(n, stageMs, 6, () => {
      const got = client.next();
      msg[0] = 0;
      toServe.send(msg);
      return got;
    });

    // ring: this process is stage 0 (busy, then sends to s1); s2 hands the token back here and to the server, which tells the client
    const s0 = await sink();
    sinks.push(s0.wss);
    const listener = await sink();
    sinks.push(listener.wss);
    const notifyServe = await relay(0, '-', listener.url);
    kids.push(notifyServe.child);
    const s2 = await relay(stageMs, s0.url, '-', notifyServe.url);
    kids.push(s2.child);
    const s1 = await relay(stageMs, s2.url);
    kids.push(s1.child);
    await settle();
    const toS1 = await connect(s1.url);
    sockets.push(toS1);
    const ring = await laps(n, stageMs, 3, () => {
      const got = s0.next();
      spin(stageMs);
      msg[0] = 0;
      toS1.send(msg);
      return got;
    });
    return { stage_ms: r3(stageMs), laps: n, route, ring };
  } finally {
    for (const s of sockets) s.close();
    for (const w of sinks) w.close();
    for (const k of kids) k.kill();
  }
}

/** a 512-wide f16 hidden state and its frame header, as a decode step carries between stages */
const HIDDEN_BYTES = 1024 + 64;
