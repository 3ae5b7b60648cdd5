// `npm run bench -- route [--layers 6 --embd 512 --ffn 1536 --vocab 2048 --decode 16 --rounds 4 --prefill 128 --long 1024] [--no-processes]`
// A 3-stage route over loopback WebSockets (stage sampling, hidden states in f16) — in this
// process, and as real `serve` + 3 `node` processes — against the same model in one process
// (one CPU backend, no sockets), on a synthetic llama model: decode tok/s over the one-way token
// path (`direct`: N + 1 hops per token) and the climbing one (`climb`: 2N), each round
// interleaved with a single-process round so a shared machine's load hits all alike, and their
// ratios (goal ≥ 0.90); prefill vs decode tok/s, decode step time at context 16 vs 1024, and
// bytes on the wire per token per hop.

import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { ByteTensorSource } from '../src/gguf/source.ts';
import { makeModelFile } from '../src/model/synthetic-model.ts';
import { InProcessChain } from '../src/route/generation.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { startLoopbackRoute } from '../src/peer/loopback.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { FrameLink } from '../src/transport/link.ts';
import { argmax } from '../src/model/sampler.ts';
import { HEADER_BYTES } from '../src/protocol/frame.ts';
import { stepBreakdown } from '../src/route/telemetry.ts';
import type { StepStageTiming } from '../src/route/telemetry.ts';
import { killAllCli, spawnCli } from './processes.ts';

export function arg(args: string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

/** The route benchmarks' synthetic llama model (`--layers --embd --ffn --vocab`), made once under .cache/. */
export async function benchModel(args: string[]): Promise<{ shape: { layers: number; embd: number; ffn: number; vocab: number; heads: number }; path: string }> {
  const shape = { layers: arg(args, 'layers', 6), embd: arg(args, 'embd', 512), ffn: arg(args, 'ffn', 1536), vocab: arg(args, 'vocab', 2048), heads: 8 };
  const dir = join(process.cwd(), '.cache');
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `bench-route-${shape.layers}x${shape.embd}x${shape.ffn}x${shape.vocab}.gguf`);
  if (!existsSync(path)) await makeModelFile(path, { arch: 'llama', ...shape, ctx: 4096, type: 'f32', seed: 7 });
  return { shape, path };
}

const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;
const avg = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

export async function run(args: string[]): Promise<unknown> {
  const { shape, path } = await benchModel(args);
  const nDecode = arg(args, 'decode', 16);
  const rounds = arg(args, 'rounds', 4);
  const nPrefill = arg(args, 'prefill', 128);
  const long = arg(args, 'long', 1024);
  const source: ByteTensorSource = await openTensorSource(path);
  const prompt = Array.from({ length: nPrefill }, (_, i) => (i * 37 + 1) % shape.vocab);

  // ---- single process: one backend over all layers, argmax here ----
  const single = new CpuBackend();
  await single.load(source, { start: 0, end: shape.layers });
  const chain = new InProcessChain([single]);
  const ctxLen = nPrefill + 2 * rounds * nDecode + 8; // the single process decodes beside the in-process and the process routes
  await chain.openSession('single', ctxLen);
  let t0 = performance.now();
  let logits = await chain.forward('single', Int32Array.from(prompt), 0);
  const singlePrefillMs = performance.now() - t0;
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

  // ---- 3 stages over loopback WebSockets: the one-way token path and the climbing one, side by side ----
  const cut = [0, Math.round(shape.layers / 3), Math.round((2 * shape.layers) / 3), shape.layers];
  const stages = [];
  for (let i = 0; i < 3; i++) {
    const b = new CpuBackend();
    await b.load(source, { start: cut[i]!, end: cut[i + 1]! });
    stages.push({ backend: b, shard: { start: cut[i]!, end: cut[i + 1]! } });
  }
  const route = await startLoopbackRoute(stages, { nLayer: shape.layers });
  const inProcess: Record<TokenPath, RouteDecoder> = {
    direct: await routeDecoder(route.clientLink, route.route.id, 'direct', prompt, ctxLen, nDecode),
    climb: await routeDecoder(route.clientLink, route.route.id, 'climb', prompt, ctxLen, nDecode),
  };
  const before = route.services.map((s) => s.wireBytesOut);
  const framesBefore = route.services.map((s) => s.framesOut);
  // interleaved rounds, best of each: the machine is shared, so the minimum is the least noisy
  const times = await interleaved({ single: singleDecode, direct: inProcess.direct.round, climb: inProcess.climb.round }, rounds);
  const hopBytes = route.services.slice(0, 2).map((s, i) => (s.wireBytesOut - before[i]!) / (s.framesOut - framesBefore[i]!));
  const sameTokens = (d: RouteDecoder): boolean => JSON.stringify(singleTokens.slice(0, d.tokens.length)) === JSON.stringify(d.tokens);
  const steps = inProcess.direct.steps;
  for (const d of Object.values(inProcess)) await d.client.close();

  // ---- decode step time at context 16 vs `long` (route) ----
  const stepAt = async (ctx: number): Promise<number> => {
    const s = await RouteSessionClient.open(route.clientLink, route.route.id, { contextLength: ctx + 24, hiddenDtype: 'f16' });
    const p = Array.from({ length: ctx }, (_, i) => (i * 13 + 5) % shape.vocab);
    let t = await s.prefill(p, 256);
    const steps = 16;
    const start = performance.now();
    for (let i = 0; i < steps; i++) t = await s.decode(t);
    const ms = (performance.now() - start) / steps;
    await s.close();
    return ms;
  };
  const step16 = await stepAt(16);
  const stepLong = await stepAt(long);
  await route.close();
  for (const s of stages) await s.backend.dispose();

  // ---- the same route as real processes: serve + 3 nodes on loopback, client over the server, rounds interleaved with the single process ----
  const processes = args.includes('--no-processes') ? null : await processRoute(path, cut, prompt, nDecode, rounds, ctxLen, singleDecode);
  await chain.releaseSession('single');
  await single.dispose();
  await source.close();

  const tokS = (ms: number): number => round((nDecode * 1000) / ms);
  const ratio = (ms: number, base: number): number => round(base / ms, 3);
  return {
    model: { path, ...shape, stages: cut.slice(0, 3).map((s, i) => `${s}-${cut[i + 1]}`) },
    same_tokens: sameTokens(inProcess.direct) && sameTokens(inProcess.climb),
    decode_rounds: { rounds, tokens_per_round: nDecode, ms: Object.fromEntries(Object.entries(times.all).map(([k, v]) => [k, v.map((x) => round(x))])) },
    single_process: { prefill_tok_s: round((nPrefill * 1000) / singlePrefillMs), decode_tok_s: tokS(times.best.single!) },
    route_3_stage_loopback_ws: {
      prefill_tok_s: round((nPrefill * 1000) / inProcess.direct.prefillMs),
      decode_tok_s: { direct: tokS(times.best.direct!), climb: tokS(times.best.climb!) },
      decode_ratio_vs_single: { direct: ratio(times.best.direct!, times.best.single!), climb: ratio(times.best.climb!, times.best.single!) },
    },
    ...(processes
      ? {
          route_3_node_processes: {
            decode_ms_per_round: Object.fromEntries(Object.entries(processes.times.all).map(([k, v]) => [k, v.map((x) => round(x))])),
            decode_tok_s: { single: tokS(processes.times.best.single!), direct: tokS(processes.times.best.direct!), climb: tokS(processes.times.best.climb!) },
            prefill_tok_s: Object.fromEntries(Object.entries(processes.prefillMs).map(([k, ms]) => [k, round((nPrefill * 1000) / ms)])),
            same_tokens: processes.sameTokens,
          },
          decode_ratio_processes_vs_single: { direct: ratio(processes.times.best.direct!, processes.times.best.single!), climb: ratio(processes.times.best.climb!, processes.times.best.single!) },
        }
      : {}),
    goal_ratio: 0.9,
    hops_per_token: { direct: 'N + 1 = 4 (server → stage 0 → 1 → 2 → server)', climb: '2N = 6 (server → 0 → 1 → 2 → 1 → 0 → server)' },
    decode_step_ms: { context_16: round(step16), [`context_${long}`]: round(stepLong) },
    decode_step_breakdown_ms: [0, 1, 2].map((k) => ({
      stage: k,
      compute: round(avg(steps.map((x) => x[k]!.computeMs)), 3),
      transfer_to_next: round(avg(steps.map((x) => x[k]!.transferMs)), 3),
      queue: round(avg(steps.map((x) => x[k]!.queueMs)), 3),
      overhead: round(avg(steps.map((x) => x[k]!.overheadMs)), 3),
    })),
    bytes_per_token_per_hop: {
      hidden_frame_f16: round(hopBytes[0]!, 1),
      expected: HEADER_BYTES + shape.embd * 2,
      token_reply: HEADER_BYTES + 4,
    },
  };
}

type TokenPath = 'direct' | 'climb';

/** One session decoding rounds of `nDecode` tokens on a route, over either token path. */
interface RouteDecoder {
  client: RouteSessionClient;
  prefillMs: number;
  tokens: number[];
  steps: StepStageTiming[][];
  round(): Promise<number>;
}

async function routeDecoder(link: FrameLink, routeId: number, tokenPath: TokenPath, prompt: number[], ctxLen: number, nDecode: number): Promise<RouteDecoder> {
  const client = await RouteSessionClient.open(link, routeId, { contextLength: ctxLen, hiddenDtype: 'f16', tokenPath });
  client.wantTimings = true; // each stage reports compute/transfer per step (a 32-byte record per stage)
  const t0 = performance.now();
  let tok = await client.prefill(prompt, prompt.length);
  const d: RouteDecoder = {
    client,
    prefillMs: performance.now() - t0,
    tokens: [tok],
    steps: [],
    async round() {
      const start = performance.now();
      for (let i = 0; i < nDecode; i++) {
        tok = await client.decode(tok);
        d.tokens.push(tok);
        d.steps.push(stepBreakdown(client.lastTimings));
      }
      return performance.now() - start;
    },
  };
  return d;
}

/** Runs each round function in turn, `rounds` times; every time, and the best per name. */
async function interleaved(fns: Record<string, () => Promise<number>>, rounds: number): Promise<{ all: Record<string, number[]>; best: Record<string, number> }> {
  const all: Record<string, number[]> = Object.fromEntries(Object.keys(fns).map((k) => [k, []]));
  for (let r = 0; r < rounds; r++) for (const [k, fn] of Object.entries(fns)) all[k]!.push(await fn());
  return { all, best: Object.fromEntries(Object.entries(all).map(([k, v]) => [k, Math.min(...v)])) };
}

/** Decode rounds of a 3-node route of real processes, driven through the server, over both token paths, interleaved with the single process's rounds. */
async function processRoute(
  model: string,
  cut: number[],
  prompt: number[],
  nDecode: number,
  rounds: number,
  ctxLen: number,
  singleDecode: () => Promise<number>,
): Promise<{ times: { all: Record<string, number[]>; best: Record<string, number> }; prefillMs: Record<string, number>; sameTokens: boolean }> {
  try {
    const [, joinUrl] = await spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', model, '--min-peers', '3']).waitFor(/join:\s+(\S+)/);
    for (let i = 0; i < 3; i++) await spawnCli(['node', '--join', joinUrl!, '--no-cache', '--layers', `${cut[i]}-${cut[i + 1]}`]).waitFor(/joined room/);
    const joined = await joinRoom(joinUrl!, undefined, 60_000);
    // prefill: the whole prompt in one frame, then in 16-token chunks (pipelined across stages)
    const prefillMs: Record<string, number> = {};
    for (const chunk of [prompt.length, 16]) {
      const p = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: ctxLen, hiddenDtype: 'f16' });
      const t0 = performance.now();
      await p.prefill(prompt, chunk);
      prefillMs[chunk === prompt.length ? 'one_frame' : 'chunks_of_16'] = performance.now() - t0;
      await p.close();
    }
    const direct = await routeDecoder(joined.link, joined.routeId, 'direct', prompt, ctxLen, nDecode);
    const climb = await routeDecoder(joined.link, joined.routeId, 'climb', prompt, ctxLen, nDecode);
    const times = await interleaved({ single: singleDecode, direct: direct.round, climb: climb.round }, rounds);
    const sameTokens = JSON.stringify(direct.tokens) === JSON.stringify(climb.tokens);
    await direct.client.close();
    await climb.client.close();
    await joined.close();
    return { times, prefillMs, sameTokens };
  } finally {
    killAllCli();
  }
}
