// What waking a sleeping process costs on this machine: a 64-byte ping-pong over loopback TCP
// with a child process, back to back (both awake) and after an idle gap as long as a decode step
// (both asleep when the ping goes). A route's token wakes a sleeping thread at every hand-off
// (client → server → each stage's socket thread → its engine thread and back → … → server →
// client) where one process decoding alone wakes none, so this figure bounds how close a route of
// processes on one machine can come to the single process. On a virtual machine an idle vCPU
// halts and waking it costs an exit to the host; on bare metal it is a few microseconds.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import type { Socket } from 'node:net';
import { median } from '../../src/stats.ts';

const CHILD = `const s = require('node:net').connect(Number(process.argv[1]), '127.0.0.1'); s.setNoDelay(true); s.on('data', (d) => s.write(d));`;

export interface WakeupCost {
  /** median round trip, both processes awake (ms) */
  busy_rtt_ms: number;
  /** median round trip after `idle_gap_ms` of quiet (ms) */
  idle_rtt_ms: number;
  idle_gap_ms: number;
  /** (idle − busy) / 2: what one wake-up of a sleeping process adds (ms) */
  per_wakeup_ms: number;
}

async function pingPong(sock: Socket, n: number, gapMs: number): Promise<number> {
  const rtts: number[] = [];
  const ping = Buffer.alloc(64);
  for (let i = 0; i < n; i++) {
    if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
    const t0 = performance.now();
    await new Promise((r) => {
      sock.once('data', r);
      sock.write(ping);
    });
    rtts.push(performance.now() - t0);
  }
  return median(rtts);
}

export async function wakeupCost(idleGapMs = 10, n = 200): Promise<WakeupCost> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = new Promise<Socket>((r) => server.once('connection', r));
  const child = spawn(process.execPath, ['-e', CHILD, String((server.address() as { port: number }).port)], { stdio: 'ignore' });
  try {
    const sock = await accepted;
    sock.setNoDelay(true);
    await pingPong(sock, 20, 0); // warm
    const busy = await pingPong(sock, n, 0);
    const idle = await pingPong(sock, n, idleGapMs);
    sock.destroy();
    const r = (x: number): number => Math.round(x * 1000) / 1000;
    return { busy_rtt_ms: r(busy), idle_rtt_ms: r(idle), idle_gap_ms: idleGapMs, per_wakeup_ms: r(Math.max(0, idle - busy) / 2) };
  } finally {
    child.kill();
    server.close();
  }
}
