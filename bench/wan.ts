// `npm run bench -- wan [--layers 6 --embd 512 --ffn 1536 --vocab 2048 --decode 12 --rounds 3 --prefill 64] [--no-cases] [--no-sweep]
//   [--pipeline-tokens 512 --pipeline-chunk 64 --pipeline-slow 10 --pipeline-delay 0 | --no-pipeline]`
// Routes of real `serve` + `node` processes on loopback, slow and far peers made with the nodes'
// test-only shaping (peer/test-shaping.ts: the kernel here has no netem): decode ms/token and
// prefill tok/s (the one-way token path; the climbing path's ms/token beside it) beside the
// model's prediction `Σ compute + (S − 1)·hop + 1 return` (goal: within 10 %), its terms from
// this run (bench/lib/wan-predict.ts: the stages' compute and overhead, the added latency, one
// loopback message a stage-to-stage hop, the entry and return as a one-stage route of the run
// measured them; the S + 3 socket hops' version beside it) — the prediction from the single process's compute and
// 0.2 ms a hop beside it — against the single process measured in the same run.
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
import { entryReturnMs, hopRoundTrips, medianStep, predictFromRun, stepCost } from './lib/wan-predict.ts';
import { median } from '../src/stats.ts';
import type { RunPrediction, StepCost } from './lib/wan-predict.ts';
import { finishLoad, goal, machineLoad } from './lib/goals.ts';
import type { Goal } from './lib/goals.ts';

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
  /** the same route on the ring (tokenPath 'ring': the last stage's token straight to stage 0, the next step already there) */
  ring_ms_per_token: number;
  /** the prediction from what this run measured (bench/lib/wan-predict.ts) */
  predicted_ms_per_token: number | null;
  prediction: RunPrediction['terms'] | null;
  /** the prediction from the single process's compute and 0.2 ms a hop (the model's own) */
  predicted_from_single_ms_per_token: number | null;
  /** the median one-way step and its stages' costs (each figure's median over the run's tokens) */
  median_step: StepCost;
  /** one loopback message's time: the median climbing hop's round trip less its added delays, halved */
  loopbackHopMs: number;
  calibrated: Array<{ peer: string; decode_ms_per_layer: number | null; rtt_ms: number | null }>;
  prefill_tok_s: { one_frame: number; chunks_of_16: number };
  same_tokens_as_single: boolean;
}

export async function run(args: string[]): Promise<unknown> {
  const load = machineLoad();
  const { shape, path } = await benchModel(args);
  const nDecode = arg(args, 'decode', 12);
  const rounds = arg(args, 'rounds', 3);
  const nPrefill = arg(args, 'prefill', 64);
  const prompt = Array.from({ length: nPrefill }, (_, i) => (i * 37 + 1) % shape.vocab);

  // the single process, for the ratio, the tokens and the prediction
  const { best, head, tokens: singleTokens } = await singleProcessDecode(path, shape.layers, prompt, nDecode, rounds);
  const predict = (stages: RouteRun['stages']): number => predictDecodeMs(best, shape.layers, head, stages);
  // the entry and the return, measured on a one-stage route (bench/lib/wan-predict.ts)
  const one = await routeRun(path, 'memory', [{}], prompt, nDecode, rounds, singleTokens);
  const entryReturn = entryReturnMs(one.median_step);
  const measure = async (planner: 'memory' | 'speed', nodes: NodeShape[]): Promise<RouteRun> => {
    const r = await routeRun(path, planner, nodes, prompt, nDecode, rounds, singleTokens);
    const run = predictFromRun(r.median_step, r.stages.map((st) => st.delayMs), r.loopbackHopMs, entryReturn);
    return { ...r, predicted_ms_per_token: round(run.predicted_ms_per_token), prediction: run.terms, predicted_from_single_ms_per_token: round(predict(r.stages)) };
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
        // the median token against the prediction from the median costs; the best round's mean beside it
        const within = (ms: number): number | null => (r.predicted_ms_per_token ? round(ms / r.predicted_ms_per_token, 3) : null);
        const asHops = r.prediction?.predicted_as_socket_hops_ms;
        sweep.push({
          n_stages: stages,
          added_rtt_ms: rtt,
          ...r,
          ratio_vs_single: round(best / r.decode_ms_per_token, 3),
          // the ring: S stage-to-stage hops a token where the one-way path pays S − 1 and the server's two (here each half a peer link's delay)
          ring_speedup_vs_one_way: round(r.decode_ms_per_token / r.ring_ms_per_token, 3),
          within_prediction: within(r.median_step.ms),
          within_prediction_best_round: within(r.decode_ms_per_token),
          within_prediction_as_socket_hops: asHops ? round(r.median_step.ms / asHops, 3) : null,
        });
      }
    }
  }
  const pipelinedPrefill = args.includes('--no-pipeline')
    ? null
    : await prefillComparison(path, shape.vocab, { tokens: arg(args, 'pipeline-tokens', 512), chunk: arg(args, 'pipeline-chunk', 64), slow: arg(args, 'pipeline-slow', 10), delayMs: arg(args, 'pipeline-delay', 0), rounds });
  const goals: Goal[] = [];
  for (const [name, c] of Object.entries(cases) as Array<[string, { speedup_speed_vs_memory: number }]>) goals.push(goal(`${name}: speed planner / memory split decode`, c.speedup_speed_vs_memory, 'min', 1.5));
  for (const r of sweep as Array<{ n_stages: number; added_rtt_ms: number; within_prediction?: number | null }>) {
    // within 10 %, either way
    if (r.within_prediction !== undefined) goals.push(goal(`|decode over ${r.n_stages} stages at +${r.added_rtt_ms} ms RTT / prediction − 1|`, Math.abs((r.within_prediction ?? NaN) - 1), 'max', 0.1));
  }
  if (pipelinedPrefill) goals.push(goal(`${pipelinedPrefill.prompt_tokens}-token prefill over ${pipelinedPrefill.n_stages} stages: stage by stage / pipelined`, pipelinedPrefill.speedup_pipelined, 'min', pipelinedPrefill.goal));
  const oneStage = { stages: one.stages, median_step: one.median_step, decode_ms_per_token: one.decode_ms_per_token, entry_return_ms: round(entryReturn, 3) };
  return { model: { path, ...shape }, single_process_decode_ms_per_token: round(best), one_stage_route: oneStage, cases, rtt_sweep: sweep, pipelined_prefill: pipelinedPrefill, goals, machine: finishLoad(load) };
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

/**
 * Best decode ms/token over `rounds` of `nDecode` on the one-way token path and the climbing one
 * of the same route (rounds interleaved), the one-way path's tokens, each of its steps with its
 * stages' costs (their timing records) and one loopback message's time (bench/lib/wan-predict.ts).
 */
export async function decodeRounds(joined: JoinedRoom, prompt: number[], nDecode: number, rounds: number): Promise<{ direct: number; climb: number; ring: number; ringTokens: number[]; tokens: number[]; steps: StepCost[]; hopRoundTrips: number[][] }> {
  const steps: StepCost[] = [];
  /** per climbing step, each stage-to-stage hop's round trip */
  const hops: number[][] = [];
  const decoder = async (tokenPath: 'direct' | 'climb' | 'ring'): Promise<{ tokens: number[]; round(): Promise<number>; close(): Promise<void> }> => {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + nDecode * rounds + 8, hiddenDtype: 'f16', tokenPath });
    c.wantTimings = true;
    let tok = await c.prefill(prompt, prompt.length);
    const tokens = [tok];
    return {
      tokens,
      async round() {
        const t0 = performance.now();
        for (let i = 0; i < nDecode; i++) {
          const s0 = performance.now();
          tokens.push((tok = await c.decode(tok)));
          if (tokenPath === 'direct') steps.push(stepCost(performance.now() - s0, c.lastTimings));
          else if (tokenPath === 'climb') hops.push(hopRoundTrips(c.lastTimings));
        }
        return (performance.now() - t0) / nDecode;
      },
      close: () => c.close(),
    };
  };
  const direct = await decoder('direct');
  const climb = await decoder('climb');
  const ring = await decoder('ring');
  let best = Infinity;
  let bestClimb = Infinity;
  let bestRing = Infinity;
  for (let r = 0; r < rounds; r++) {
    best = Math.min(best, await direct.round());
    bestClimb = Math.min(bestClimb, await climb.round());
    bestRing = Math.min(bestRing, await ring.round());
  }
  const tokens = direct.tokens;
  for (const d of [direct, climb, ring]) await d.close();
  return { direct: best, climb: bestClimb, ring: bestRing, ringTokens: ring.tokens, tokens, steps, hopRoundTrips: hops };
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
    const shapeOf = (peerId: string): NodeShape => nodes[Number(/^w(\d+)/.exec(peerId)?.[1] ?? -1)] ?? {};
    const prefill: Record<string, number> = {};
    for (const chunk of [prompt.length, 16]) {
      const p = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + 8, hiddenDtype: 'f16' });
      const t0 = performance.now();
      await p.prefill(prompt, chunk);
      prefill[chunk === prompt.length ? 'one_frame' : 'chunks_of_16'] = round((prompt.length * 1000) / (performance.now() - t0));
      await p.close();
    }
    const { peers } = await fetchJson<{ peers: Array<{ id: string; memoryBytes: number; speed?: { decodeMsPerLayer: number }; rttMs: number | null }> }>(`${joined.base}/v1/rooms/${joined.roomId}/peers`, joined.secret);
    const { direct: best, climb: bestClimb, ring, ringTokens, tokens, steps, hopRoundTrips: hops } = await decodeRounds(joined, prompt, nDecode, rounds);
    const delays = route.stages.map((s) => shapeOf(s.peerId).delayMs ?? 0);
    // a climbing hop k → k + 1 waits on k's link delay out and back and k + 1's on the answer (its delay in is in its handling)
    const loopbackHopMs = median(hops.flatMap((h) => h.map((ms, k) => (ms - 2 * delays[k]! - delays[k + 1]!) / 2)));
    await joined.close();
    return {
      planner,
      stages: route.stages.map((s) => ({ peer: s.peerId, layers: `${s.shard.start}-${s.shard.end}`, slow: shapeOf(s.peerId).slow ?? 1, delayMs: shapeOf(s.peerId).delayMs ?? 0 })),
      decode_ms_per_token: round(best),
      climbing_path_ms_per_token: round(bestClimb),
      ring_ms_per_token: round(ring),
      predicted_ms_per_token: null,
      prediction: null,
      predicted_from_single_ms_per_token: null,
      median_step: medianStep(steps),
      loopbackHopMs,
      calibrated: peers.map((p) => ({ peer: p.id, decode_ms_per_layer: p.speed ? round(p.speed.decodeMsPerLayer, 3) : null, rtt_ms: p.rttMs === null ? null : round(p.rttMs) })),
      prefill_tok_s: prefill as RouteRun['prefill_tok_s'],
      same_tokens_as_single: JSON.stringify(tokens) === JSON.stringify(singleTokens.slice(0, tokens.length)) && JSON.stringify(ringTokens) === JSON.stringify(tokens),
    };
  } finally {
    killAllCli();
    await new Promise((r) => setTimeout(r, 300));
  }
}
