// `npm run bench -- signaling [--peers 5000] [--senders 16] [--messages 2000] [--samples 1000]`:
// what the signaling server holds, as real `serve --redis` processes on one redis-server (the
// bench's own, on a loopback port) with real WebSocket peers admitted by the room's challenge:
//   (a) idle peer sockets one instance holds: `--peers` admitted, then 5 s of heartbeats (the
//       server pings each twice a second) — how many the room still counts, its memory;
//   (b) control messages per second one instance forwards: `--senders` peers each send
//       `--messages` WebRTC signals to their own receiver as fast as the socket takes them;
//   (c) the latency a cross-instance hop adds: a signal from a peer joined through the other
//       instance (passed on over the instance link) against one from a peer joined at the holder,
//       `--samples` each, one at a time; p50/p99 one-way (sender and receiver share this clock);
//   (d) two instances against one: (b) with each instance holding one of two rooms, the senders
//       split between them.
// Goals (issue 24): (a) ≥ 5,000 sockets held; (b) ≥ 20,000 messages/s; (c) ≤ 1 ms added at p99;
// (d) ≥ 1.8× one instance. All processes share this machine's cores with the bench's clients.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import WebSocket from 'ws';
import { Directory } from '../signaling-server/directory.ts';
import { helloProof } from '../src/protocol/control.ts';
import { freePort } from '../test/support/ports.ts';
import { stories260K } from '../test/support/models.ts';
import { finishLoad, goal, machineLoad } from './lib/goals.ts';
import { numberArg, round } from './lib/serve-route.ts';
import { killAllCli, spawnCli } from './processes.ts';
import type { CliProcess } from './processes.ts';

const SECRET = 'bench-signaling-secret';

interface Peer {
  ws: WebSocket;
  id: string;
  /** signals received: their payloads */
  onSignal: ((signal: { n: number; t: number }) => void) | null;
}

/** A bare peer: answers the challenge, is welcomed, then only answers pings (ws does) and reads signals. */
function joinPeer(base: string, roomId: string, name: string): Promise<Peer> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`);
    const peer: Peer = { ws, id: '', onSignal: null };
    ws.on('error', reject);
    ws.on('message', (data) => {
      const m = JSON.parse(data.toString()) as { t: string; nonce?: string; peerId?: string; signal?: { n: number; t: number }; message?: string };
      if (m.t === 'challenge') void helloProof(SECRET, m.nonce!).then((proof) => ws.send(JSON.stringify({ t: 'hello', proof, name, backend: 'bench', memoryBytes: 0 })));
      else if (m.t === 'welcome') {
        peer.id = m.peerId!;
        resolve(peer);
      } else if (m.t === 'signal') peer.onSignal?.(m.signal!);
      else if (m.t === 'error') reject(new Error(`${name}: ${m.message}`));
    });
  });
}

async function joinMany(base: string, roomId: string, n: number, prefix: string): Promise<Peer[]> {
  const out: Peer[] = [];
  for (let i = 0; i < n; i += 250) out.push(...(await Promise.all(Array.from({ length: Math.min(250, n - i) }, (_, k) => joinPeer(base, roomId, `${prefix}${i + k}`)))));
  return out;
}

/** Whether something listens on the loopback port now. */
function portTaken(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const c = connect(port, '127.0.0.1');
    c.once('connect', () => (c.destroy(), resolve(true)));
    c.once('error', () => resolve(false));
  });
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? round(Number(m[1]) / 1024) : NaN;
}

async function json(url: string): Promise<any> {
  return (await fetch(url, { headers: { authorization: `Bearer ${SECRET}` } })).json();
}

/** `pairs` of (sender, receiver): every sender sends `count` signals at once; messages/s until the last arrives. */
async function throughput(pairs: Array<[Peer, Peer]>, count: number): Promise<number> {
  const t0 = performance.now();
  await Promise.all(
    pairs.map(
      ([from, to]) =>
        new Promise<void>((resolve) => {
          let got = 0;
          to.onSignal = () => {
            if (++got === count) resolve();
          };
          for (let n = 0; n < count; n++) from.ws.send(JSON.stringify({ t: 'signal', to: to.id, cid: 'bench', signal: { n, t: 0 } }));
        }),
    ),
  );
  return (pairs.length * count) / ((performance.now() - t0) / 1000);
}

/** One-way latencies (ms) of `samples` signals from `from` to `to`, one at a time. */
async function latencies(from: Peer, to: Peer, samples: number): Promise<number[]> {
  const out: number[] = [];
  for (let n = 0; n < samples; n++) {
    const arrived = new Promise<number>((resolve) => (to.onSignal = (s) => resolve(performance.now() - s.t)));
    from.ws.send(JSON.stringify({ t: 'signal', to: to.id, cid: 'bench', signal: { n, t: performance.now() } }));
    out.push(await arrived);
  }
  return out.sort((a, b) => a - b);
}

const pct = (sorted: number[], p: number): number => round(sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!, 3);

async function instance(model: string, redisUrl: string, prefix: string, extraModels: string[] = []): Promise<{ proc: CliProcess; base: string }> {
  const port = await freePort();
  const proc = spawnCli(['serve', '--port', String(port), '--ui', 'off', '--quiet', '--model', model, ...extraModels.flatMap((m) => ['--model', m]), '--secret', SECRET, '--redis', redisUrl, '--redis-prefix', prefix, '--min-peers', '1000000']);
  await proc.waitFor(/listening on/);
  return { proc, base: `http://127.0.0.1:${port}` };
}

async function holdCount(base: string): Promise<number> {
  return ((await (await fetch(`${base}/v1/health`)).json()) as { cluster: { holds: number } }).cluster.holds;
}

async function until(ok: () => Promise<boolean>, what: string, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`signaling bench: ${what} did not happen within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function run(args: string[]): Promise<unknown> {
  const nPeers = numberArg(args, 'peers', 5000);
  const senders = numberArg(args, 'senders', 16);
  const messages = numberArg(args, 'messages', 2000);
  const samples = numberArg(args, 'samples', 1000);
  const load = machineLoad();
  const model = await stories260K();
  const redisPort = await freePort();
  const redis = spawn('redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const redisUrl = `redis://127.0.0.1:${redisPort}`;
  try {
    await until(() => portTaken(redisPort), 'redis-server starting');
    // two instances; the one the room settles on is A, the other B
    const both = await Promise.all([instance(model, redisUrl, 'one:'), instance(model, redisUrl, 'one:')]);
    await until(async () => (await holdCount(both[0]!.base)) + (await holdCount(both[1]!.base)) === 1, 'one instance holding the room');
    await new Promise((r) => setTimeout(r, 2_000)); // an idle room may still move to the instance it prefers
    await until(async () => (await holdCount(both[0]!.base)) + (await holdCount(both[1]!.base)) === 1, 'one instance holding the room');
    const [a, b] = (await holdCount(both[0]!.base)) === 1 ? both : [both[1]!, both[0]!];
    const roomId = ((await json(`${a.base}/v1/rooms`)) as { rooms: Array<{ id: string }> }).rooms[0]!.id;

    // (a) idle sockets
    const t0 = performance.now();
    const idle = await joinMany(a.base, roomId, nPeers, 'idle-');
    const admitMs = performance.now() - t0;
    await new Promise((r) => setTimeout(r, 5_000));
    const held = ((await json(`${a.base}/v1/rooms/${roomId}`)) as { peers: number }).peers;
    const open = idle.filter((p) => p.ws.readyState === WebSocket.OPEN).length;
    const idleResult = { asked: nPeers, held, stillOpen: open, admitSeconds: round(admitMs / 1000, 2), admittedPerSecond: round(nPeers / (admitMs / 1000)), serverRssMiB: rssMiB(a.proc.child.pid!) };
    for (const p of idle) p.ws.terminate();
    await until(async () => ((await json(`${a.base}/v1/rooms/${roomId}`)) as { peers: number }).peers === 0, 'the idle peers leaving');

    // (b) messages/s through one instance
    const pairs = await Promise.all(Array.from({ length: senders }, async (_, i): Promise<[Peer, Peer]> => [await joinPeer(a.base, roomId, `s${i}`), await joinPeer(a.base, roomId, `r${i}`)]));
    const oneInstance = await throughput(pairs, messages);

    // (c) the cross-instance hop
    const receiver = pairs[0]![1];
    const direct = await joinPeer(a.base, roomId, 'direct');
    const linked = await joinPeer(b.base, roomId, 'linked');
    await latencies(direct, receiver, 50); // warm both paths
    await latencies(linked, receiver, 50);
    const d = await latencies(direct, receiver, samples);
    const l = await latencies(linked, receiver, samples);
    for (const [x, y] of pairs) (x.ws.terminate(), y.ws.terminate());
    direct.ws.terminate();
    linked.ws.terminate();
    await killAllCli();

    // (d) two instances, one room each (two rooms: the model twice), the senders split
    const [c1, c2] = await Promise.all([instance(model, redisUrl, 'two:', [model]), instance(model, redisUrl, 'two:', [model])]);
    // idle rooms move to the instance each prefers: one each, unless both hash to the same one
    await new Promise((r) => setTimeout(r, 3_000));
    await until(async () => (await holdCount(c1.base)) + (await holdCount(c2.base)) === 2, 'the two rooms held');
    const rooms = ((await json(`${c1.base}/v1/rooms`)) as { rooms: Array<{ id: string }> }).rooms.map((r) => r.id);
    const split = [await holdCount(c1.base), await holdCount(c2.base)];
    // each room's peers join the instance holding it (else they are passed on to it)
    const dir = await Directory.connect(redisUrl, { prefix: 'two:' });
    const holders = await Promise.all(rooms.map(async (r) => (await dir.instance((await dir.lease(r))!.instance))!.url));
    await dir.close();
    const twoPairs: Array<[Peer, Peer]> = [];
    for (let i = 0; i < senders; i++) {
      const k = i % 2;
      twoPairs.push([await joinPeer(holders[k]!, rooms[k]!, `s${i}`), await joinPeer(holders[k]!, rooms[k]!, `r${i}`)]);
    }
    const twoInstances = await throughput(twoPairs, messages);
    for (const [x, y] of twoPairs) (x.ws.terminate(), y.ws.terminate());

    const addedP99 = pct(l, 99) - pct(d, 99);
    return {
      bench: 'signaling',
      machine: finishLoad(load),
      idle: idleResult,
      messages: { senders, perSender: messages, oneInstancePerSecond: round(oneInstance), twoInstancesPerSecond: round(twoInstances), roomsHeld: split },
      hop: { samples, directMs: { p50: pct(d, 50), p99: pct(d, 99) }, linkedMs: { p50: pct(l, 50), p99: pct(l, 99) }, addedP99Ms: round(addedP99, 3) },
      goals: [
        goal('idle peer sockets one instance holds', held, 'min', 5000),
        goal('control messages/s one instance forwards', oneInstance, 'min', 20_000),
        goal('p99 ms a cross-instance hop adds', addedP99, 'max', 1),
        goal('messages/s two instances / one', twoInstances / oneInstance, 'min', 1.8),
      ],
    };
  } finally {
    await killAllCli();
    redis.kill('SIGKILL');
  }
}
