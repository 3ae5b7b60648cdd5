// Processes and sockets for the probes: `gguf-mesh` commands of any checkout (so the same probe
// measures the code before and after a change), their RSS and CPU time from /proc, free ports,
// and raw peer/client sockets on the signaling server.

import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import { cpuMs as readCpuMs } from '../lib/cpu-time.ts';

export interface Proc {
  child: ChildProcess;
  output(): string;
  waitFor(re: RegExp, ms?: number): Promise<RegExpMatchArray>;
  exited: Promise<number>;
  alive(): boolean;
  kill(): Promise<number>;
}

export function spawnCli(root: string, args: string[], env: NodeJS.ProcessEnv = {}): Proc {
  const child = spawn(process.execPath, [join(root, 'bin', 'gguf-mesh.js'), ...args], { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  let code: number | null = null;
  const exited = new Promise<number>((r) => child.on('exit', (c, sig) => r((code = c ?? (sig ? 128 : -1)))));
  return {
    child,
    output: () => out,
    async waitFor(re, ms = 60_000) {
      const deadline = Date.now() + ms;
      for (;;) {
        const m = out.match(re);
        if (m) return m;
        if (code !== null) throw new Error(`exited ${code} before ${re}: ${out.slice(-400)}`);
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${re}: ${out.slice(-400)}`);
        await sleep(50);
      }
    },
    exited,
    alive: () => code === null,
    async kill() {
      if (code === null) child.kill('SIGKILL');
      return exited;
    },
  };
}

/** Runs `fn` with a fresh temporary folder, removed afterwards whatever happens. */
export async function withTempDir<T>(prefix: string, fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  try {
    return await fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export { freePort } from '../../test/support/ports.ts';

/** Resident set size of a process (MiB), from /proc. */
export function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Math.round(Number(m[1]) / 1024) : NaN;
}

/** User + system CPU time of a process (ms), from /proc (../lib/cpu-time.ts); throws where /proc cannot tell. */
export function cpuMs(pid: number): number {
  const ms = readCpuMs(pid);
  if (ms === null) throw new Error(`no CPU time for process ${pid}: /proc/${pid}/stat cannot be read`);
  return ms;
}

export interface Served {
  proc: Proc;
  base: string;
  joinUrl: string;
  secret: string;
  roomId: string;
}

export async function serve(root: string, model: string, extra: string[] = []): Promise<Served> {
  const proc = spawnCli(root, ['serve', '--port', '0', '--ui', 'off', '--model', model, ...extra]);
  const [, joinUrl] = await proc.waitFor(/join:\s+(\S+)/);
  const [, secret] = await proc.waitFor(/secret:\s+(\S+)/);
  const u = new URL(joinUrl!);
  return { proc, base: `${u.protocol}//${u.host}`, joinUrl: joinUrl!, secret: secret!, roomId: u.pathname.split('/').pop()! };
}

export async function node(root: string, s: Served, extra: string[] = []): Promise<Proc> {
  const p = spawnCli(root, ['node', '--join', s.joinUrl, '--no-cache', ...extra]);
  await p.waitFor(/joined room/);
  return p;
}

export async function getJson(url: string, secret: string): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { headers: { authorization: `Bearer ${secret}` } });
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, body };
}

export async function waitReady(s: Served, ms = 60_000): Promise<number> {
  const deadline = Date.now() + ms;
  for (;;) {
    const { body } = await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret);
    if (body?.route?.status === 'ready') return body.route.id as number;
    if (Date.now() > deadline) throw new Error(`route not ready: ${JSON.stringify(body)}`);
    await sleep(100);
  }
}

/** The server answers an authenticated request (it is alive and serving). */
export async function answers(s: Served): Promise<boolean> {
  try {
    return (await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret)).status === 200;
  } catch {
    return false;
  }
}

export interface RawSocket {
  ws: WebSocket;
  next(ms?: number): Promise<Record<string, unknown> | null>;
  send(text: string): void;
}

export async function rawPeer(s: Served): Promise<RawSocket> {
  const ws = new WebSocket(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/peer`);
  const inbox: Array<Record<string, unknown>> = [];
  ws.on('message', (d, bin) => !bin && inbox.push(JSON.parse(d.toString())));
  await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
  return {
    ws,
    async next(ms = 3000) {
      const deadline = Date.now() + ms;
      while (!inbox.length && Date.now() < deadline && ws.readyState === ws.OPEN) await sleep(10);
      return inbox.shift() ?? null;
    },
    send: (t) => ws.send(t),
  };
}

export function proofFor(secret: string, nonce: string): string {
  return createHmac('sha256', secret).update(nonce).digest('hex');
}
