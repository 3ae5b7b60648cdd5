// Real `gguf-mesh serve` and `gguf-mesh node` processes for end-to-end tests: spawn them on
// free loopback ports, wait for the lines that say they are up, and kill every one at the end.
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { LlamaModel } from 'node-llama-cpp';
import { CLI, REPO_ROOT } from './cli.ts';
import { joinRoom } from '../../src/route/remote.ts';
import type { JoinedRoom } from '../../src/route/remote.ts';

export interface MeshProcess {
  child: ChildProcessWithoutNullStreams;
  output: () => string;
  /** resolves with the first match of `re` in the output so far or later */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  exited: Promise<number>;
  kill(signal?: NodeJS.Signals): Promise<number>;
}

const running = new Set<MeshProcess>();

// Nodes keep verified shards in ~/.cache/gguf-mesh/shards by default, and the planner keeps a
// peer on the range it holds: a shard left there by another run would change this file's
// routes (a node holding every layer gets a one-stage route). Each test file gets its own.
let shardCacheDir: string | undefined;

/** The shard cache this test file's nodes share (unless a test names `--cache-dir` or `--no-cache`). */
export function testShardCache(): string {
  shardCacheDir ??= mkdtempSync(join(tmpdir(), 'gguf-mesh-test-shards-'));
  return shardCacheDir;
}

/** `prefix`: a command the process runs under (e.g. `ip netns exec <ns>`, test/support/netns.ts). */
export function spawnMesh(args: string[], opts: { prefix?: string[]; env?: NodeJS.ProcessEnv } = {}): MeshProcess {
  if (args[0] === 'node' && !args.includes('--cache-dir') && !args.includes('--no-cache')) args = [...args, '--cache-dir', testShardCache()];
  return spawnCommand([...(opts.prefix ?? []), process.execPath, CLI, ...args], opts.env, `gguf-mesh ${args.join(' ')}`);
}

/** Any command (`argv[0]` the program), watched and killed at the end like spawnMesh's. */
export function spawnCommand(command: string[], env: NodeJS.ProcessEnv = {}, label = command.join(' ')): MeshProcess {
  const [cmd, ...argv] = command;
  const child = spawn(cmd!, argv, { cwd: REPO_ROOT, stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let out = '';
  const waiters: Array<() => void> = [];
  const onData = (d: Buffer): void => {
    out += d.toString();
    for (const w of [...waiters]) w();
  };
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  const exited = new Promise<number>((resolve) => child.on('exit', (code, sig) => resolve(code ?? (sig ? 128 : -1))));
  const p: MeshProcess = {
    child,
    output: () => out,
    waitFor(re, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const check = (): boolean => {
          const m = out.match(re);
          if (m) {
            waiters.splice(waiters.indexOf(check), 1);
            clearTimeout(timer);
            resolve(m);
            return true;
          }
          return false;
        };
        const timer = setTimeout(() => {
          waiters.splice(waiters.indexOf(check), 1);
          reject(new Error(`timed out waiting for ${re} in output of ${label}:\n${out}`));
        }, timeoutMs);
        waiters.push(check);
        check();
        void exited.then((code) => {
          if (!check()) {
            clearTimeout(timer);
            reject(new Error(`${label.split(' ').slice(0, 2).join(' ')} exited with ${code} before printing ${re}:\n${out}`));
          }
        });
      });
    },
    exited,
    async kill(signal = 'SIGKILL') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const code = await exited;
      running.delete(p);
      return code;
    },
  };
  running.add(p);
  void exited.then(() => running.delete(p));
  return p;
}

/** Kills every process spawned by this test file (call in afterAll). */
export async function killAll(): Promise<void> {
  await Promise.all([...running].map((p) => p.kill('SIGKILL')));
  if (shardCacheDir) rmSync(shardCacheDir, { recursive: true, force: true });
  shardCacheDir = undefined;
}

export interface ServeInfo {
  proc: MeshProcess;
  base: string;
  joinUrl: string;
  secret: string;
  roomId: string;
}

export async function spawnServe(model: string, extra: string[] = []): Promise<ServeInfo> {
  const proc = spawnMesh(['serve', '--port', '0', '--ui', 'off', '--model', model, ...extra]);
  const [, joinUrl] = await proc.waitFor(/join:\s+(\S+)/);
  const [, secret] = await proc.waitFor(/secret:\s+(\S+)/);
  const u = new URL(joinUrl!);
  return { proc, base: `${u.protocol}//${u.host}`, joinUrl: joinUrl!, secret: secret!, roomId: u.pathname.split('/').pop()! };
}

export async function getJson<T = any>(url: string, secret: string): Promise<{ status: number; body: T }> {
  const res = await fetch(url, { headers: { authorization: `Bearer ${secret}` } });
  return { status: res.status, body: (await res.json()) as T };
}

/** The room's current route as `GET /v1/routes/{id}` describes it (stages, spares, status), or null before one is planned. */
export async function currentRoute(s: ServeInfo): Promise<any> {
  const room = (await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret)).body;
  return room.route ? (await getJson(`${s.base}/v1/routes/${room.route.id}`, s.secret)).body : null;
}

/** Polls until the room's route reaches `status`. */
export async function waitForRoute(s: ServeInfo, status: string, timeoutMs = 60_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { body } = await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret);
    if (body.route?.status === status) return (await getJson(`${s.base}/v1/routes/${body.route.id}`, s.secret)).body;
    if (Date.now() > deadline) throw new Error(`route never became ${status}: ${JSON.stringify(body)}\n${s.proc.output()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Waits until the room's route is ready, then joins the room as a client of that route. */
export async function joinReadyRoute(s: ServeInfo): Promise<JoinedRoom> {
  await waitForRoute(s, 'ready');
  return joinRoom(s.joinUrl, s.secret);
}

/** afterAll for route tests: closes the client, disposes the llama.cpp oracle (either may be unset when beforeAll failed early), kills every spawned process. */
export async function closeRouteTest(joined: JoinedRoom | undefined, oracle: LlamaModel | undefined): Promise<void> {
  await joined?.close();
  await oracle?.dispose();
  await killAll();
}

/** The room's event stream (server-sent events), read from its replay until a `"status":"ready"` appears; the events parsed, in order. */
export async function roomEventsUntilReady(s: ServeInfo): Promise<any[]> {
  const ctl = new AbortController();
  const res = await fetch(`${s.base}/v1/rooms/${s.roomId}/events`, { headers: { authorization: `Bearer ${s.secret}` }, signal: ctl.signal });
  const reader = res.body!.getReader();
  let text = '';
  while (!text.includes('"status":"ready"')) text += new TextDecoder().decode((await reader.read()).value);
  ctl.abort();
  return [...text.matchAll(/^data: (.*)$/gm)].map((m) => JSON.parse(m[1]!));
}

/** `serve` with `--min-peers names.length` and one `node` per name joined (with `nodeArgs`), the route ready. */
export async function serveWithNodes(model: string, names: readonly string[], nodeArgs: readonly string[] = []): Promise<ServeInfo> {
  const serve = await spawnServe(model, ['--min-peers', String(names.length)]);
  for (const name of names) await spawnMesh(['node', '--join', serve.joinUrl, '--name', name, '--no-cache', ...nodeArgs]).waitFor(/joined room/);
  await waitForRoute(serve, 'ready');
  return serve;
}
