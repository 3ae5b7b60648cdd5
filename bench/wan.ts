// `npm run bench -- wan [--layers 6 --embd 512 --ffn 1536 --vocab 2048 --decode 12 --rounds 3 --prefill 64] [--no-cases] [--no-sweep]
//   [--pipeline-tokens 512 --pipeline-chunk 64 --pipeline-slow 10 --pipeline-delay 0 | --no-pipeline]`
// Routes of real `serve` + `node` processes on loopback, slow and far peers made with the nodes'
// test-only shaping (peer/test-shaping.ts: the kernel here has no netem): decode ms/token and
// prefill tok/s (the one-way token path; the climbing path's ms/token beside it) beside the model's prediction (route/speed-planner.ts predictStepMs: Σ compute
// + the hops' latency), against the single process measured in the same run.
//  - planner cases: 3 nodes, one 4× slower (slow-peer) or 40 ms of round trip away (far-peer);
//    the memory split (serve --planner memory) against the planner that knows speed and links
//    (goal ≥ 1.5×);
//  - the RTT sweep: 2 and 3 stages with every node's round trip raised by 0, 10, 40, 100 ms;
//  - pipelined prefill: a 512-token prompt over 3 stages, pipelined against stage by stage in the
//    same run (bench/wan-prefill.ts; goal ≥ 2×), the nodes slowed so their compute dominates.
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { fetchJson } from '../src/transport/server-json.ts';
import { headLayers } from '../signaling-server/plan-choice.ts';
import { argmax } from '../src/model/sampler.ts';
import { killAllCli, spawnCli } from './processes.ts';
import { arg, benchModel } from './route.ts';
import { prefillComparison } from './wan-prefill.ts';

const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;

interface NodeShape {
  slow?: number;
  delayMs?: number;
}

interface RouteRun {
  planner: 'memory' | 'speed';
  stages: Array<{ peer: string; layers: string; slow: number; delayMs: number }>;
  decode_ms_per_token: number;
  /** the same route with the token climbing back through every stage (session tokenPath 'climb') */
  climbing_path_ms_per_token: number;
  predicted_ms_per_token: number | null;
  calibrated: Array<{ peer: string; decode_ms_per_layer: number | null; rtt_ms: number | null }>;
  prefill_tok_s: { one_frame: number; chunks_of_16: number };
  same_tokens_as_single: boolean;
}

export async function run(args: string[]): Promise<unknown> {
  const { shape, path } = await benchModel(args);
  const nDecode = arg(args, 'decode', 12);
  const rounds = arg(args, 'rounds', 3);
  const nPrefill = arg(args, 'prefill', 64);
  const prompt = Array.from({ length: nPrefill }, (_, i) => (i * 37 + 1) % shape.vocab);

  // the single process, for the ratio, the tokens and the prediction
  const { best, head, tokens: singleTokens } = await singleProcessDecode(path, shape.layers, prompt, nDecode, rounds);
  const predict = (stages: RouteRun['stages']): number => predictDecodeMs(best, shape.layers, head, stages);
  const measure = async (planner: 'memory' | 'speed', nodes: NodeShape[]): Promise<RouteRun> => {
    const r = await routeRun(path, planner, nodes, prompt, nDecode, rounds, singleTokens);
    return { ...r, predicted_ms_per_token: round(predict(r.stages)) };
  };
  const cases: Record<string, unknown> = {};
  for (const [name, nodes] of args.includes('--no-cases') ? [] : [
    ['slow_peer', [{}, {}, { slow: 4 }]],
    ['far_peer', [{}, {}, { delayMs: 20 }]],
  ] as Array<[string, NodeShape[]]>) {
    const memory = await measure('memory', nodes);
    const speed = await measure('speed', nodes);
    cases[name] = { memory, speed, speedup_speed_vs_memory: round(memory.decode_ms_per_token / speed.decode_ms_per_token, 3), goal: 1.5 };
  }
  const sweep: unknown[] = [];
  if (!args.includes('--no-sweep')) {
    for (const stages of [2, 3]) {
      for (const rtt of [0, 10, 40, 100]) {
        // every node's links gain rtt/2 of round trip per side: stage to stage rtt, server to stage rtt/2
        const r = await measure('memory', Array.from({ length: stages }, () => ({ delayMs: rtt / 4 }))).catch((e: Error) => e);
        if (r instanceof Error) {
          sweep.push({ n_stages: stages, added_rtt_ms: rtt, error: r.message });
          continue;
        }
        sweep.push({ n_stages: stages, added_rtt_ms: rtt, ...r, ratio_vs_single: round(best / r.decode_ms_per_token, 3), within_prediction: r.predicted_ms_per_token ? round(r.decode_ms_per_token / r.predicted_ms_per_token, 3) : null });
      }
    }
  }
  const pipelinedPrefill = args.includes('--no-pipeline')
    ? null
    : await prefillComparison(path, shape.vocab, { tokens: arg(args, 'pipeline-tokens', 512), chunk: arg(args, 'pipeline-chunk', 64), slow: arg(args, 'pipeline-slow', 10), delayMs: arg(args, 'pipeline-delay', 0), rounds });
  return { model: { path, ...shape }, single_process_decode_ms_per_token: round(best), cases, rtt_sweep: sweep, pipelined_prefill: pipelinedPrefill };
}

/** The single process's best decode ms/token over `rounds` of `nDecode` after `prompt`, its greedy tokens, and the head's layer-equivalents. */
export async function singleProcessDecode(path: string, layers: number, prompt: number[], nDecode: number, rounds: number): Promise<{ best: number; head: number; tokens: number[] }> {
  const source = await openTensorSource(path);
  const head = headLayers(source.header, layers);
  const single = new CpuBackend();
  await single.load(source, { start: 0, end: layers });
  const chain = new InProcessChain([single]);
  await chain.openSession('s', prompt.length + nDecode * rounds + 8);
  let tok = argmax(await chain.forward('s', Int32Array.from(prompt), 0));
  const singleTokens = [tok];
  let best = Infinity;
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    for (let i = 0; i < nDecode; i++) {
      tok = argmax(await chain.forward('s', Int32Array.of(tok), prompt.length + r * nDecode + i));
      singleTokens.push(tok);
    }
    best = Math.min(best, (performance.now() - t0) / nDecode);
  }
  await single.dispose();
  await source.close();

  return { best, head, tokens: singleTokens };
}

/**
 * The model's prediction of a route's decode step from the single process's `singleMs`: Σ compute
 * (a layer costs one share of it, the head `head` shares, times the node's slow factor) + every
 * hop's added latency (a node's delay on each side it touches) + 0.2 ms per hop.
 */
export function predictDecodeMs(singleMs: number, layers: number, head: number, stages: ReadonlyArray<{ layers: string; slow: number; delayMs: number }>): number {
  const layerMs = singleMs / (layers + head);
  let ms = 0.2 * (stages.length + 1);
  for (const s of stages) {
    const [a, b] = s.layers.split('-').map(Number);
    ms += (b! - a!) * layerMs * s.slow + s.delayMs * 2; // in and out of this node
  }
  return ms + head * layerMs * stages.at(-1)!.slow;
}

/** Best decode ms/token over `rounds` of `nDecode` on the one-way token path and the climbing one of the same route (rounds interleaved), and the one-way path's tokens. */
export async function decodeRounds(joined: JoinedRoom, prompt: number[], nDecode: number, rounds: number): Promise<{ direct: number; climb: number; tokens: number[] }> {
  const decoder = async (tokenPath: 'direct' | 'climb'): Promise<{ tokens: number[]; round(): Promise<number>; close(): Promise<void> }> => {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + nDecode * rounds + 8, hiddenDtype: 'f16', tokenPath });
    let tok = await c.prefill(prompt, prompt.length);
    const tokens = [tok];
    return {
      tokens,
      async round() {
        const t0 = performance.now();
        for (let i = 0; i < nDecode; i++) tokens.push((tok = await c.decode(tok)));
        return (performance.now() - t0) / nDecode;
      },
      close: () => c.close(),
    };
  };
  const direct = await decoder('direct');
  const climb = await decoder('climb');
  let best = Infinity;
  let bestClimb = Infinity;
  for (let r = 0; r < rounds; r++) {
    best = Math.min(best, await direct.round());
    bestClimb = Math.min(bestClimb, await climb.round());
  }
  const tokens = direct.tokens;
  await direct.close();
  await climb.close();
  return { direct: best, climb: bestClimb, tokens };
}

/** One route of real processes: serve with `planner`, one node per shape, then prefill and decode through the server. */
async function routeRun(model: string, planner: 'memory' | 'speed', nodes: NodeShape[], prompt: number[], nDecode: number, rounds: number, singleTokens: number[]): Promise<RouteRun> {
  try {
    // the plan waits for a few heartbeats, so each peer's round trip is known to the planner
    const [, joinUrl] = await spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', model, '--min-peers', String(nodes.length), '--plan-delay', '2000', '--standby', 'off', '--planner', planner, '--heartbeat-timeout', '20000']).waitFor(/join:\s+(\S+)/);
    const names: string[] = [];
    for (const [i, n] of nodes.entries()) {
      names.push(`w${i}`);
      const shaping = [...(n.slow ? ['--test-slow-factor', String(n.slow)] : []), ...(n.delayMs ? ['--test-link-delay-ms', String(n.delayMs)] : [])];
      await spawnCli(['node', '--join', joinUrl!, '--no-cache', '--memory', '4GiB', '--name', `w${i}`, ...shaping]).waitFor(/joined room/);
    }
    const joined = await joinRoom(joinUrl!, undefined, 60_000);
    const route = await fetchJson<{ stages: Array<{ peerId: string; shard: { start: number; end: number } }> }>(`${joined.base}/v1/routes/${joined.routeId}`, joined.secret);
    const { peers } = await fetchJson<{ peers: Array<{ id: string; memoryBytes: number; speed?: { decodeMsPerLayer: number }; rttMs: number | null }> }>(`${joined.base}/v1/rooms/${joined.roomId}/peers`, joined.secret);
    const shapeOf = (peerId: string): NodeShape => nodes[Number(/^w(\d+)/.exec(peerId)?.[1] ?? -1)] ?? {};
    const prefill: Record<string, number> = {};
    for (const chunk of [prompt.length, 16]) {
      const p = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + 8, hiddenDtype: 'f16' });
      const t0 = performance.now();
      await p.prefill(prompt, chunk);
      prefill[chunk === prompt.length ? 'one_frame' : 'chunks_of_16'] = round((prompt.length * 1000) / (performance.now() - t0));
      await p.close();
    }
    const { direct: best, climb: bestClimb, tokens } = await decodeRounds(joined, prompt, nDecode, rounds);
    await joined.close();
    return {
      planner,
      stages: route.stages.map((s) => ({ peer: s.peerId, layers: `${s.shard.start}-${s.shard.end}`, slow: shapeOf(s.peerId).slow ?? 1, delayMs: shapeOf(s.peerId).delayMs ?? 0 })),
      decode_ms_per_token: round(best),
      climbing_path_ms_per_token: round(bestClimb),
      predicted_ms_per_token: null,
      calibrated: peers.map((p) => ({ peer: p.id, decode_ms_per_layer: p.speed ? round(p.speed.decodeMsPerLayer, 3) : null, rtt_ms: p.rttMs === null ? null : round(p.rttMs) })),
      prefill_tok_s: prefill as RouteRun['prefill_tok_s'],
      same_tokens_as_single: JSON.stringify(tokens) === JSON.stringify(singleTokens.slice(0, tokens.length)),
    };
  } finally {
    killAllCli();
    await new Promise((r) => setTimeout(r, 300));
  }
}
