// Pipelined prefill against stage by stage, on one route of real processes (bench/wan.ts runs it):
// serve + 3 nodes, a long prompt (default 512 tokens) sent in `chunk`-token chunks either
// pipelined (the client sends every chunk at once, the session manager and every stage pass a
// chunk on without waiting: route/prefill-pipeline.ts) or stage by stage (each chunk's answer,
// its last row sampled, comes back from the last stage before the next chunk is sent). The
// nodes run with --test-slow-factor (and optionally --test-link-delay-ms) so each stage's compute
// dominates as on three real devices, instead of three processes sharing this machine's cores,
// and on one thread each: a pass is slowed by its own CPU time (peer/test-shaping.ts), and two
// threads of one node that wait for a core another node holds spin-wait for each other, CPU
// time that only the pipelined passes (three nodes computing at once) paid.
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import { killAllCli, spawnCli } from './processes.ts';

const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;

export interface PrefillComparison {
  n_stages: number;
  prompt_tokens: number;
  chunk_tokens: number;
  shaping: { test_slow_factor: number; test_link_delay_ms: number };
  pipelined_ms: number;
  stage_by_stage_ms: number;
  pipelined_tok_s: number;
  stage_by_stage_tok_s: number;
  speedup_pipelined: number;
  same_first_token: boolean;
  goal: number;
}

export async function prefillComparison(model: string, vocab: number, opts: { tokens: number; chunk: number; slow: number; delayMs: number; rounds: number; stages?: number }): Promise<PrefillComparison> {
  const nStages = opts.stages ?? 3;
  const prompt = Array.from({ length: opts.tokens }, (_, i) => (i * 37 + 1) % vocab);
  try {
    const procs: ReturnType<typeof spawnCli>[] = [];
    const serve = spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', model, '--min-peers', String(nStages), '--standby', 'off', '--planner', 'memory', '--heartbeat-timeout', '20000']);
    procs.push(serve);
    const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/);
    const shaping = [...(opts.slow > 1 ? ['--test-slow-factor', String(opts.slow)] : []), ...(opts.delayMs > 0 ? ['--test-link-delay-ms', String(opts.delayMs)] : [])];
    for (let i = 0; i < nStages; i++) {
      const n = spawnCli(['node', '--join', joinUrl!, '--no-cache', '--memory', '4GiB', '--name', `p${i}`, '--threads', '1', ...shaping]);
      procs.push(n);
      await n.waitFor(/joined room/);
    }
    const joined = await joinRoom(joinUrl!, undefined, 60_000);
    const once = async (pipelined: boolean): Promise<{ ms: number; token: number }> => {
      const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + 8, hiddenDtype: 'f16' });
      const t0 = performance.now();
      let token = -1;
      try {
        if (pipelined) token = await c.prefill(prompt, opts.chunk);
        else for (let i = 0; i < prompt.length; i += opts.chunk) token = await c.prefill(prompt.slice(i, i + opts.chunk), opts.chunk);
      } catch (e) {
        // what the processes said (a node that left says why)
        console.error(procs.map((p) => p.output().slice(-1500)).join('\n----\n'));
        throw e;
      }
      const ms = performance.now() - t0;
      await c.close();
      return { ms, token };
    };
    await once(true); // warm-up: first-use allocations on every stage
    let best = { pipelined: Infinity, serial: Infinity };
    const tokens = new Set<number>();
    for (let r = 0; r < opts.rounds; r++) {
      const p = await once(true);
      const s = await once(false);
      tokens.add(p.token).add(s.token);
      best = { pipelined: Math.min(best.pipelined, p.ms), serial: Math.min(best.serial, s.ms) };
    }
    await joined.close();
    return {
      n_stages: nStages,
      prompt_tokens: prompt.length,
      chunk_tokens: opts.chunk,
      shaping: { test_slow_factor: opts.slow, test_link_delay_ms: opts.delayMs },
      pipelined_ms: round(best.pipelined),
      stage_by_stage_ms: round(best.serial),
      pipelined_tok_s: round((prompt.length * 1000) / best.pipelined),
      stage_by_stage_tok_s: round((prompt.length * 1000) / best.serial),
      speedup_pipelined: round(best.serial / best.pipelined, 3),
      same_first_token: tokens.size === 1,
      goal: 2,
    };
  } finally {
    killAllCli();
    await new Promise((r) => setTimeout(r, 300));
  }
}
