// `npm run bench -- route [--layers 6 --embd 512 --ffn 1536 --vocab 2048 --decode 16 --rounds 4
//   --prefill 128 --contexts 16,256,1024,2048 --threads N] [--no-processes]`
// A 3-stage route of CPU stages over loopback WebSockets (stage sampling, hidden states in f16)
// — in this process, and as real `serve` + 3 `node` processes — against the same model in one
// process (one CPU backend, no sockets), on a synthetic f32 llama model. Reports decode tok/s
// and their ratio to one process, prefill tok/s against decode tok/s on the route (per prefill
// chunk size), the decode step time at several contexts, and bytes per token per hop.
// Goals: decode step at context 1024 ≤ 1.3× the step at 16; route prefill ≥ 10× route decode
// (in this process and as processes). The route/one-process decode ratio is reported too.

import { existsSync, mkdirSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { makeModelFile } from '../src/model/synthetic-model.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { DEFAULT_PREFILL_CHUNK, RouteSessionClient } from '../src/route/client.ts';
import type { FrameLink } from '../src/transport/link.ts';
import { startLoopbackRoute } from '../src/peer/loopback.ts';
import { joinRoom } from '../src/route/remote.ts';
import { argmax } from '../src/model/sampler.ts';
import { HEADER_BYTES } from '../src/protocol/frame.ts';
import { stepBreakdown } from '../src/route/telemetry.ts';
import type { StepStageTiming } from '../src/route/telemetry.ts';
import { best, finishLoad, goal, machineLoad, round2 } from './lib/goals.ts';
import { killAllCli, spawnCli } from './processes.ts';

function arg(args: string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

const avg = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
/** prefill chunk sizes tried on the route (the client's default among them) */
const CHUNKS = [...new Set([16, 32, DEFAULT_PREFILL_CHUNK, 128])].sort((a, b) => a - b);

interface RouteTarget {
  link: FrameLink;
  routeId: number;
}

/** best prefill ms of `prompt` per chunk size (a fresh session each time), over `rounds` */
async function prefillTimes(t: RouteTarget, prompt: number[], ctxLen: number, rounds: number): Promise<Record<number, number>> {
  const times: Record<number, number[]> = {};
  for (let r = 0; r < rounds; r++) {
    for (const chunk of CHUNKS) {
      const s = await RouteSessionClient.open(t.link, t.routeId, { contextLength: ctxLen, hiddenDtype: 'f16' });
      const t0 = performance.now();
      await s.prefill(prompt, chunk);
      (times[chunk] ??= []).push(performance.now() - t0);
      await s.close();
    }
  }
  return Object.fromEntries(CHUNKS.map((c) => [c, best(times[c]!)]));
}

/** decode step ms at each context (prefilled once), best of interleaved rounds of 8 steps */
async function stepTimes(t: RouteTarget, contexts: number[], vocab: number, rounds: number): Promise<Record<number, number>> {
  const sessions = [];
  for (const ctx of contexts) {
    const s = await RouteSessionClient.open(t.link, t.routeId, { contextLength: ctx + 8 * rounds + 8, hiddenDtype: 'f16' });
    const p = Array.from({ length: ctx }, (_, i) => (i * 13 + 5) % vocab);
    sessions.push({ ctx, s, tok: await s.prefill(p, 256), times: [] as number[] });
  }
  for (let r = 0; r < rounds; r++) {
    for (const x of sessions) {
      const t0 = performance.now();
      for (let i = 0; i < 8; i++) x.tok = await x.s.decode(x.tok);
      x.times.push((performance.now() - t0) / 8);
    }
  }
  for (const x of sessions) await x.s.close();
  return Object.fromEntries(sessions.map((x) => [x.ctx, best(x.times)]));
}

export async function run(args: string[]): Promise<unknown> {
  const shape = { layers: arg(args, 'layers', 6), embd: arg(args, 'embd', 512), ffn: arg(args, 'ffn', 1536), vocab: arg(args, 'vocab', 2048), heads: 8 };
  const nDecode = arg(args, 'decode', 16);
  const rounds = arg(args, 'rounds', 4);
  const nPrefill = arg(args, 'prefill', 128);
  const threads = arg(args, 'threads', availableParallelism());
  const i = args.indexOf('--contexts');
  const contexts = (i >= 0 ? args[i + 1]! : '16,256,1024,2048').split(',').map(Number);
  const load = machineLoad();
  const dir = join(process.cwd(), '.cache');
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `bench-route-${shape.layers}x${shape.embd}x${shape.ffn}x${shape.vocab}.gguf`);
  if (!existsSync(path)) await makeModelFile(path, { arch: 'llama', ...shape, ctx: 4096, type: 'f32', seed: 7 });
  const source = await openTensorSource(path);
  const prompt = Array.from({ length: nPrefill }, (_, i) => (i * 37 + 1) % shape.vocab);
  const ctxLen = nPrefill + rounds * nDecode + 8;

  // ---- single process: one backend over all layers, argmax here ----
  const single = createNodeCpuBackend({ threads });
  await single.load(source, { start: 0, end: shape.layers });
  const chain = new InProcessChain([single]);
  await chain.openSession('single', ctxLen);
  let logits = await chain.forward('single', Int32Array.from(prompt), 0);
  let singleTok = argmax(logits);
  const singleTokens = [singleTok];
  let singlePos = nPrefill;
  const singleDecode = async (): Promise<number> => {
    const start = performance.now();
    for (let i = 0; i < nDecode; i++) {
      logits = await chain.forward('single', Int32Array.of(singleTok), singlePos++);
      singleTok = argmax(logits);
      singleTokens.push(singleTok);
    }
    return performance.now() - start;
  };

  // ---- 3 stages over loopback WebSockets ----
  const cut = [0, Math.round(shape.layers / 3), Math.round((2 * shape.layers) / 3), shape.layers];
  const stages = [];
  for (let i = 0; i < 3; i++) {
    const b = createNodeCpuBackend({ threads });
    await b.load(source, { start: cut[i]!, end: cut[i + 1]! });
    stages.push({ backend: b, shard: { start: cut[i]!, end: cut[i + 1]! } });
  }
  const route = await startLoopbackRoute(stages, { nLayer: shape.layers });
  const target = { link: route.clientLink, routeId: route.route.id };
  const c = await RouteSessionClient.open(route.clientLink, route.route.id, { contextLength: ctxLen, hiddenDtype: 'f16' });
  c.wantTimings = true; // each stage reports compute/transfer per step (a 32-byte record per stage on the reply)
  let routeTok = await c.prefill(prompt, nPrefill);
  const routeTokens = [routeTok];
  const before = route.services.map((s) => s.wireBytesOut);
  const framesBefore = route.services.map((s) => s.framesOut);
  const steps: StepStageTiming[][] = [];
  const routeDecode = async (): Promise<number> => {
    const start = performance.now();
    for (let i = 0; i < nDecode; i++) {
      routeTok = await c.decode(routeTok);
      routeTokens.push(routeTok);
      steps.push(stepBreakdown(c.lastTimings));
    }
    return performance.now() - start;
  };
  // interleaved rounds, best of each: the machine is shared, so the minimum is the least noisy
  const singleTimes: number[] = [];
  const routeTimes: number[] = [];
  for (let r = 0; r < rounds; r++) {
    singleTimes.push(await singleDecode());
    routeTimes.push(await routeDecode());
  }
  await chain.releaseSession('single');
  const hopBytes = route.services.slice(0, 2).map((s, i) => (s.wireBytesOut - before[i]!) / (s.framesOut - framesBefore[i]!));
  await c.close();
  const routePrefill = await prefillTimes(target, prompt, ctxLen, rounds);
  const stepMs = await stepTimes(target, contexts, shape.vocab, rounds);
  await route.close();
  for (const s of stages) await s.backend.dispose();
  await single.dispose();
  await source.close();

  // ---- the same route as real processes: serve + 3 nodes on loopback, client over the server ----
  const processes = args.includes('--no-processes') ? null : await processRoute(path, cut, prompt, nDecode, rounds, ctxLen, threads);

  const singleDecodeTokS = (nDecode * 1000) / best(singleTimes);
  const routeDecodeTokS = (nDecode * 1000) / best(routeTimes);
  const tokS = (ms: Record<number, number>) => Object.fromEntries(Object.entries(ms).map(([k, v]) => [`chunk_${k}`, round2((nPrefill * 1000) / v)]));
  const bestPrefill = (ms: Record<number, number>) => (nPrefill * 1000) / Math.min(...Object.values(ms));
  const goals = [
    goal('decode step at context 1024 / at context 16 (CPU route)', (stepMs[1024] ?? NaN) / (stepMs[16] ?? NaN), 'max', 1.3),
    goal('route prefill / route decode tok/s (in this process)', bestPrefill(routePrefill) / routeDecodeTokS, 'min', 10),
  ];
  if (processes) goals.push(goal('route prefill / route decode tok/s (3 node processes)', bestPrefill(processes.prefillMs) / ((nDecode * 1000) / best(processes.times)), 'min', 10));
  return {
    model: { path, ...shape, stages: cut.slice(0, 3).map((s, i) => `${s}-${cut[i + 1]}`) },
    threads_per_stage: threads,
    // hidden states cross the hops as f16: where two logits of this random model nearly tie,
    // the route's greedy token may part from the one-process run (f32 hops give the same tokens)
    same_tokens_as_one_process: JSON.stringify(singleTokens) === JSON.stringify(routeTokens),
    first_different_token: singleTokens.findIndex((t, i) => t !== routeTokens[i]),
    decode_rounds: { rounds, tokens_per_round: nDecode, single_ms: singleTimes.map(round2), route_ms: routeTimes.map(round2) },
    single_process: { decode_tok_s: round2(singleDecodeTokS) },
    // issue 18's goal (≥ 0.9, a one-way token path), reported here, checked there
    decode_ratio_route_vs_single: round2(routeDecodeTokS / singleDecodeTokS),
    route_3_stage_loopback_ws: { decode_tok_s: round2(routeDecodeTokS), prefill_tok_s: tokS(routePrefill) },
    ...(processes
      ? { route_3_node_processes: { decode_ms_per_round: processes.times.map(round2), decode_tok_s: round2((nDecode * 1000) / best(processes.times)), prefill_tok_s: tokS(processes.prefillMs) } }
      : {}),
    decode_step_ms: Object.fromEntries(Object.entries(stepMs).map(([k, v]) => [`context_${k}`, round2(v)])),
    decode_step_breakdown_ms: [0, 1, 2].map((k) => ({
      stage: k,
      compute: round2(avg(steps.map((x) => x[k]!.computeMs))),
      transfer_to_next: round2(avg(steps.map((x) => x[k]!.transferMs))),
      queue: round2(avg(steps.map((x) => x[k]!.queueMs))),
      overhead: round2(avg(steps.map((x) => x[k]!.overheadMs))),
    })),
    bytes_per_token_per_hop: { hidden_frame_f16: round2(hopBytes[0]!), expected: HEADER_BYTES + shape.embd * 2, token_reply: HEADER_BYTES + 4 },
    machine: finishLoad(load),
    goals,
  };
}

/** Decode round times and prefill times per chunk (ms) of a 3-node route of real processes, driven through the server. */
async function processRoute(model: string, cut: number[], prompt: number[], nDecode: number, rounds: number, ctxLen: number, threads: number): Promise<{ times: number[]; prefillMs: Record<number, number> }> {
  try {
    // a stage computes on its event loop's thread, and on a shared machine (load 15 on 2 cores) a
    // load or a chunk can keep it from answering pings for longer than the default 3.5 s
    const serve = ['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', model, '--min-peers', '3', '--heartbeat-timeout', '30000'];
    const [, joinUrl] = await spawnCli(serve).waitFor(/join:\s+(\S+)/);
    for (let i = 0; i < 3; i++) await spawnCli(['node', '--join', joinUrl!, '--no-cache', '--threads', String(threads), '--layers', `${cut[i]}-${cut[i + 1]}`]).waitFor(/joined room/);
    const joined = await joinRoom(joinUrl!, undefined, 60_000);
    const target = { link: joined.link, routeId: joined.routeId };
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: ctxLen, hiddenDtype: 'f16' });
    let tok = await c.prefill(prompt, prompt.length);
    const times: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const t0 = performance.now();
      for (let i = 0; i < nDecode; i++) tok = await c.decode(tok);
      times.push(performance.now() - t0);
    }
    await c.close();
    const prefillMs = await prefillTimes(target, prompt, ctxLen, rounds);
    await joined.close();
    return { times, prefillMs };
  } finally {
    killAllCli();
  }
}
