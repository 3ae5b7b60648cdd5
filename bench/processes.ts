// Real `gguf-mesh` processes for benchmarks: spawn the CLI, wait for the line that says it is
// up, signal it, and kill every one at the end.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';

export interface CliProcess {
  child: ChildProcess;
  output(): string;
  /** the first match of `re` in the output so far or later */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  exited: Promise<number>;
}

const running = new Set<CliProcess>();

export function spawnCli(args: string[]): CliProcess {
  const cli = join(process.cwd(), 'bin', 'gguf-mesh.js');
  const child = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const waiters = new Set<() => void>();
  const onData = (d: Buffer): void => {
    out += d.toString();
    for (const w of [...waiters]) w();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<number>((resolve) => child.on('exit', (code, sig) => resolve(code ?? (sig ? 128 : -1))));
  const p: CliProcess = {
    child,
    output: () => out,
    exited,
    waitFor(re, timeoutMs = 120_000) {
      return new Promise((resolve, reject) => {
        const check = (): void => {
          const m = out.match(re);
          if (!m) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(m);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`gguf-mesh ${args[0]}: no ${re} within ${timeoutMs} ms:\n${out.slice(-2000)}`));
        }, timeoutMs);
        waiters.add(check);
        check();
        void exited.then((code) => {
          if (!waiters.has(check)) return;
          waiters.delete(check);
          clearTimeout(timer);
          reject(new Error(`gguf-mesh ${args[0]} exited with ${code} before ${re}:\n${out.slice(-2000)}`));
        });
      });
    },
  };
  running.add(p);
  void exited.then(() => running.delete(p));
  return p;
}

/** Kills every process spawned here (a SIGSTOPped one too). */
export function killAllCli(): void {
  for (const p of running) {
    p.child.kill('SIGCONT');
    p.child.kill('SIGKILL');
  }
}
