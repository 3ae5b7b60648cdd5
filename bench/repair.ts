// `npm run bench -- repair [--histories 16,256,1024] [--rounds 3] [--chaos 50] [--layers 6 --embd 512 --ffn 1536 --vocab 2048]`
// What a user feels when a stage of a 3-stage route of real processes (serve + node, CPU
// backend, loopback) goes away mid-reply: the gap between two streamed tokens, from the fault
// (kill -9, or kill -STOP with its detection included) to the next token, against the history
// the session holds, with a warm spare (standby shard loaded) and a cold one (loads when it
// takes over) — and against recomputing everything on a fresh session (a client that starts
// over). Goals: at the longest history with a warm spare, p95 ≤ 3 s after a kill, ≤ 6 s after a
// stall, and repair ≥ 3× faster than the recompute. Then a chaos run: N generations, each with a
// random stage killed, stopped or terminated at a random step and a spare rejoining; every one
// must give llama.cpp's greedy tokens. Exit code 1 when a goal is missed.

import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { openTensorSource } from '../src/gguf/source.ts';
import { LlamaCppStage } from '../src/backends/llamacpp/stage.ts';
import { argmax } from '../src/model/sampler.ts';
import { makeModelFile } from '../src/model/synthetic-model.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { killAllCli, spawnCli } from './processes.ts';
import { goal } from './lib/goals.ts';
import type { CliProcess } from './processes.ts';

function arg(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1]! : fallback;
}

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;
function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] ?? NaN;
}
const summary = (xs: number[]): Record<string, number> => ({ n: xs.length, p50_ms: round(pct(xs, 50)), p95_ms: round(pct(xs, 95)), max_ms: round(Math.max(...xs)) });

type Fault = 'SIGKILL' | 'SIGSTOP' | 'SIGTERM';

/** A serve process and its nodes, with the route's stage → process map read from the server. */
class Mesh {
  readonly nodes = new Map<string, CliProcess>();
  /** what went wrong in a round, reported beside the figures */
  readonly failures: string[] = [];
  readonly afterRound: (() => void)[] = [];
  private count = 0;
  joinUrl = '';
  base = '';
  secret = '';
  room!: JoinedRoom;

  constructor(
    private readonly model: string,
    readonly cut: number[],
    private readonly standby: boolean,
  ) {}

  /** every node killed, then a fresh route and spares, in the same room */
  async restart(): Promise<void> {
    for (const p of this.nodes.values()) {
      p.child.kill('SIGCONT');
      p.child.kill('SIGKILL');
    }
    this.nodes.clear();
    for (let i = 0; i < 3; i++) await this.node(i).waitFor(/joined room/);
    await this.until(() => true);
    for (let i = 0; i < 3; i++) await this.spare(i);
  }

  async start(): Promise<void> {
    const serve = spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', this.model, '--min-peers', '3', '--standby', this.standby ? 'on' : 'off']);
    const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/);
    const [, secret] = await serve.waitFor(/secret:\s+(\S+)/);
    this.joinUrl = joinUrl!;
    this.secret = secret!;
    this.base = new URL(this.joinUrl).origin;
    for (let i = 0; i < 3; i++) await this.node(i).waitFor(/joined room/);
    this.room = await joinRoom(this.joinUrl, undefined, 120_000);
    for (let i = 0; i < 3; i++) await this.spare(i);
  }

  /** a node asking for stage `stage`'s layers */
  node(stage: number): CliProcess {
    const name = `b${this.count++}`;
    const p = spawnCli(['node', '--join', this.joinUrl, '--no-cache', '--memory', '2GiB', '--name', name, '--layers', `${this.cut[stage]}-${this.cut[stage + 1]}`]);
    this.nodes.set(name, p);
    return p;
  }

  /** a new spare for `stage`, ready (standby loaded, when standbys are on) */
  async spare(stage: number): Promise<void> {
    const p = this.node(stage);
    await p.waitFor(/joined room/);
    await this.until(async (r) => r.spares.some((s: any) => s.peerId.startsWith(`b${this.count - 1}-`) && (s.status === 'ready' || !this.standby)) || (!this.standby && r.status === 'ready'));
  }

  async route(): Promise<any> {
    const get = async (path: string): Promise<any> => (await fetch(`${this.base}${path}`, { headers: { authorization: `Bearer ${this.secret}` } })).json();
    const room = await get(`/v1/rooms/${this.room.roomId}`);
    return get(`/v1/routes/${room.route.id}`);
  }

  async until(ok: (route: any) => Promise<boolean> | boolean, ms = 120_000): Promise<any> {
    const deadline = Date.now() + ms;
    for (;;) {
      const r = await this.route();
      if (r.status === 'ready' && (await ok(r))) return r;
      if (Date.now() > deadline) throw new Error(`route not as wanted: ${JSON.stringify(r).slice(0, 2000)}`);
      await new Promise((res) => setTimeout(res, 100));
    }
  }

  async stageProcess(stage: number): Promise<CliProcess> {
    const r = await this.route();
    return this.nodes.get(String(r.stages[stage].peerId).split('-')[0]!)!;
  }

  /** a session on the room's current route (a restart may have planned a new one) */
  async session(contextLength: number): Promise<RouteSessionClient> {
    const route = await this.route();
    return RouteSessionClient.open(this.room.link, route.id, { contextLength, hiddenDtype: 'f16' });
  }
}

/** Prefills `history` tokens, decodes a few, then hits stage `stage` with `fault`: ms from the fault to the next token. */
async function gapAfterFault(mesh: Mesh, history: number, stage: number, fault: Fault, vocab: number): Promise<number> {
  try {
    const gap = await faultOnce(mesh, history, stage, fault, vocab);
    console.error(`[repair] ${fault} of stage ${stage} at history ${history}: ${Math.round(gap)} ms`);
    return gap;
  } catch (e) {
    // one failed repair is a figure too (it counts against the goals), not the end of the bench
    const route = await mesh.route().catch((err: Error) => err.message);
    console.error(`[repair] ${fault} of stage ${stage} at history ${history} failed: ${(e as Error).message}\nroute: ${JSON.stringify(route).slice(0, 3000)}`);
    mesh.failures.push(`${fault} of stage ${stage} at history ${history}: ${(e as Error).message}`);
    await mesh.restart(); // the route may be left without a spare for each lost stage
    return Infinity;
  }
}

async function faultOnce(mesh: Mesh, history: number, stage: number, fault: Fault, vocab: number): Promise<number> {
  const c = await mesh.session(history + 16);
  const prompt = Array.from({ length: history - 4 }, (_, i) => (i * 37 + 11) % vocab);
  let tok = await c.prefill(prompt, 64);
  for (let i = 0; i < 3; i++) tok = await c.decode(tok);
  const victim = await mesh.stageProcess(stage);
  const t0 = performance.now();
  victim.child.kill(fault);
  // a stopped process is killed once the round is over, whether or not the repair worked
  if (fault === 'SIGSTOP') mesh.afterRound.push(() => victim.child.kill('SIGKILL'));
  try {
    tok = await c.decode(tok);
  } finally {
    for (const f of mesh.afterRound.splice(0)) f();
  }
  const gap = performance.now() - t0;
  await c.close();
  await mesh.spare(stage);
  return gap;
}

/** Time to the first token of a fresh session that prefills the whole history again. */
async function recomputeMs(mesh: Mesh, history: number, vocab: number): Promise<number> {
  const c = await mesh.session(history + 16);
  const prompt = Array.from({ length: history - 4 }, (_, i) => (i * 37 + 11) % vocab);
  const t0 = performance.now();
  let tok = await c.prefill(prompt, 64);
  for (let i = 0; i < 3; i++) tok = await c.decode(tok);
  const ms = performance.now() - t0;
  await c.close();
  return ms;
}

/** llama.cpp's greedy continuation (flash attention off, f32 KV): the chaos run's oracle. */
async function llamaCppGreedy(model: string, prompt: number[], n: number): Promise<number[]> {
  const stage = new LlamaCppStage({ kvType: 'f32', flashAttention: false });
  const src = await openTensorSource(model);
  const nLayer = Number(src.header.metadata['llama.block_count']);
  await stage.load(src, { start: 0, end: nLayer });
  await stage.openSession('o', { contextLength: prompt.length + n + 1 });
  const out: number[] = [];
  let r = await stage.forward('o', { kind: 'tokens', tokens: Int32Array.from(prompt) }, 0);
  for (let i = 0; i < n; i++) {
    if (r.output.kind !== 'logits') throw new Error('no logits');
    out.push(argmax(r.output.logits));
    if (i + 1 < n) r = await stage.forward('o', { kind: 'tokens', tokens: Int32Array.of(out.at(-1)!) }, prompt.length + i);
  }
  await stage.dispose();
  await src.close();
  return out;
}

async function chaos(mesh: Mesh, runs: number, model: string, vocab: number): Promise<Record<string, unknown>> {
  const prompt = Array.from({ length: 24 }, (_, i) => (i * 53 + 7) % vocab);
  const n = 48;
  const expected = await llamaCppGreedy(model, prompt, n);
  const faults: Fault[] = ['SIGKILL', 'SIGSTOP', 'SIGTERM'];
  const gaps: Record<Fault, number[]> = { SIGKILL: [], SIGSTOP: [], SIGTERM: [] };
  let same = 0;
  const failures: string[] = [];
  let seed = 12345;
  const rand = (k: number): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % k);
  for (let run = 0; run < runs; run++) {
    const stage = rand(3);
    const fault = faults[rand(3)]!;
    const at = 2 + rand(n - 6);
    const c = await mesh.session(prompt.length + n + 1);
    const tokens = [await c.prefill(prompt, 16)];
    let victim: CliProcess | null = null;
    try {
      while (tokens.length < n) {
        if (tokens.length === at) {
          victim = await mesh.stageProcess(stage);
          const t0 = performance.now();
          victim.child.kill(fault);
          tokens.push(await c.decode(tokens.at(-1)!));
          gaps[fault].push(performance.now() - t0);
          continue;
        }
        tokens.push(await c.decode(tokens.at(-1)!));
      }
      if (tokens.every((t, i) => t === expected[i])) same++;
      else failures.push(`run ${run}: ${fault} of stage ${stage} at token ${at}: tokens differ from llama.cpp's from ${tokens.findIndex((t, i) => t !== expected[i])}`);
    } catch (e) {
      failures.push(`run ${run}: ${fault} of stage ${stage} at token ${at}: ${(e as Error).message}`);
    }
    await c.close().catch(() => undefined);
    if (victim && fault === 'SIGSTOP') victim.child.kill('SIGKILL');
    await mesh.spare(stage);
  }
  const all = [...gaps.SIGKILL, ...gaps.SIGSTOP, ...gaps.SIGTERM];
  return { runs, identical_to_llama_cpp: same, failures, repair_gap: summary(all), by_fault: Object.fromEntries(Object.entries(gaps).map(([k, v]) => [k, summary(v)])) };
}

export async function run(args: string[]): Promise<unknown> {
  const shape = { layers: Number(arg(args, 'layers', '6')), embd: Number(arg(args, 'embd', '512')), ffn: Number(arg(args, 'ffn', '1536')), vocab: Number(arg(args, 'vocab', '2048')), heads: 8 };
  const histories = arg(args, 'histories', '16,256,1024').split(',').map(Number);
  const rounds = Number(arg(args, 'rounds', '3'));
  const chaosRuns = Number(arg(args, 'chaos', '50'));
  const dir = join(process.cwd(), '.cache');
  mkdirSync(dir, { recursive: true });
  const model = join(dir, `bench-route-${shape.layers}x${shape.embd}x${shape.ffn}x${shape.vocab}.gguf`);
  if (!existsSync(model)) await makeModelFile(model, { arch: 'llama', ...shape, ctx: 4096, type: 'f32', seed: 7 });
  const cut = [0, Math.round(shape.layers / 3), Math.round((2 * shape.layers) / 3), shape.layers];
  const longest = Math.max(...histories);
  const out: Record<string, unknown> = { model: { ...shape, type: 'f32', stages: cut }, load_average: (await import('node:os')).loadavg().map((x) => round(x, 2)) };
  try {
    const table: Record<string, Record<string, unknown>> = {};
    let warmKill: number[] = [];
    let warmStall: number[] = [];
    let recompute = 0;
    for (const standby of [true, false]) {
      const mesh = new Mesh(model, cut, standby);
      await mesh.start();
      for (const h of histories) {
        const kills: number[] = [];
        for (let r = 0; r < rounds; r++) kills.push(await gapAfterFault(mesh, h, 1, 'SIGKILL', shape.vocab));
        const row: Record<string, unknown> = { kill_9: summary(kills) };
        if (standby && h === longest) {
          const stalls: number[] = [];
          for (let r = 0; r < rounds; r++) stalls.push(await gapAfterFault(mesh, h, 1, 'SIGSTOP', shape.vocab));
          row.kill_stop = summary(stalls);
          warmKill = kills;
          warmStall = stalls;
        }
        if (standby) {
          const rec = await recomputeMs(mesh, h, shape.vocab);
          row.recompute_ms = round(rec);
          if (h === longest) recompute = rec;
        }
        table[`${standby ? 'warm' : 'cold'}_history_${h}`] = row;
      }
      if (mesh.failures.length) out[`${standby ? 'warm' : 'cold'}_failures`] = mesh.failures;
      if (standby && chaosRuns > 0) out.chaos = await chaos(mesh, chaosRuns, model, shape.vocab);
      killAllCli();
    }
    out.repair = table;
    // goals in bench/lib/goals.ts's form: bench/main.ts reads them for the exit code
    const chaosOk = !out.chaos || (out.chaos as { identical_to_llama_cpp: number }).identical_to_llama_cpp === chaosRuns;
    out.goals = [
      goal('p95 repair gap after kill -9, warm spare, longest history (ms)', pct(warmKill, 95), 'max', 3000),
      goal('p95 repair gap after kill -STOP, warm spare, longest history (ms)', pct(warmStall, 95), 'max', 6000),
      goal('full recompute / p50 warm repair gap, longest history', recompute / pct(warmKill, 50), 'min', 3),
      goal('chaos generations identical to llama.cpp (1 = all)', chaosOk ? 1 : 0, 'min', 1),
    ];
  } finally {
    killAllCli();
  }
  return out;
}
