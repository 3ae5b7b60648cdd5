// `npm run bench -- wan-lab [--n 32 --rounds 3 --rtt 0,40 --stages node|tab]` (root: network namespaces)
// A real route across the routed lab (test/support/netns.ts): `serve` and the client (bench wan's
// decode rounds, bench/lib/lab-decode.ts; plain HTTP: the lab is the test's own) in one namespace, two `gguf-mesh node` processes in two others
// (--stages tab: two headless Chromium tabs on WebGPU instead, serve on HTTPS with its local CA, the tabs meeting on its STUN), every
// packet between them through the router's shaper — the latency is on the wire, not in the
// nodes (bench wan's --test-link-delay-ms). For each added RTT, each node's link gets rtt/4 of
// delay (node to node rtt of round trip, server to node rtt/2; the server's link none, as in
// bench wan's sweep): decode ms/token (best of the rounds; one-way token path, the climbing one beside it) beside bench wan's prediction
// from what the run measured (bench/lib/wan-predict.ts; goal: within 10 %) and the one from the
// single process's compute and 0.2 ms a hop, on stories260K.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { configFromHeader } from '../src/model/config.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { NetLab } from '../test/support/netns.ts';
import { killAll, spawnCommand, spawnMesh } from '../test/support/mesh.ts';
import type { MeshProcess } from '../test/support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from '../test/support/models.ts';
import { arg } from './route.ts';
import { predictDecodeMs, singleProcessDecode } from './wan.ts';
import { medianStep, predictFromRun } from './lib/wan-predict.ts';
import { median } from '../src/stats.ts';
import type { RunPrediction, StepCost } from './lib/wan-predict.ts';
import { goal } from './lib/goals.ts';
import { launchInHost } from '../test/support/lab-browser.ts';
import type { LabBrowser } from '../test/support/lab-browser.ts';
import { openRoomPage, readyRoute, serveIn } from '../test/support/lab-room.ts';
import { ensureBuilt } from '../test/fixtures/ui/harness.ts';

const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;
const NODES = ['n1', 'n2'];

type StageKind = 'node' | 'tab';

interface LabRun {
  added_rtt_ms: number;
  /** gguf-mesh node processes (cpu), or Chromium tabs (WebGPU on this machine's adapter) */
  stage_kind: StageKind;
  link_delay_ms: { serve: number; node: number };
  stages: Array<{ peer: string; layers: string; delayMs: number }>;
  /** best round, the one-way token path (N + 1 hops) */
  decode_ms_per_token: number;
  /** best round, the token climbing back through every stage (2N hops) */
  climbing_path_ms_per_token: number;
  /** best round on the ring (the last stage's token straight to stage 0: N hops, the server off the path) */
  ring_ms_per_token: number;
  predicted_ms_per_token: number;
  prediction: RunPrediction['terms'];
  predicted_from_single_ms_per_token: number;
  /** the median token / the prediction; the best round's mean / the prediction */
  within_prediction: number;
  within_prediction_best_round: number;
  /** the median one-way step and its stages' costs (bench/lib/wan-predict.ts) */
  median_step: StepCost;
  loopbackHopMs: number;
  tokens: number[];
  same_tokens_as_single: boolean;
}

export async function run(args: string[]): Promise<unknown> {
  const path = await stories260K();
  const n = arg(args, 'n', 32);
  const rounds = arg(args, 'rounds', 3);
  const rtts = (args.includes('--rtt') ? args[args.indexOf('--rtt') + 1] ?? '' : '0,40').split(',').map(Number);
  if (rtts.some((x) => !(x >= 0))) throw new Error(`--rtt must be a comma-separated list of ms ≥ 0, got ${args[args.indexOf('--rtt') + 1]}`);
  const kind = (args.includes('--stages') ? args[args.indexOf('--stages') + 1] : 'node') as StageKind;
  if (kind !== 'node' && kind !== 'tab') throw new Error(`--stages must be node or tab, got ${kind}`);
  if (kind === 'tab') await ensureBuilt(); // the room page the tabs open
  const source = await openTensorSource(path);
  const layers = configFromHeader(source.header).nLayer;
  await source.close();
  const single = await singleProcessDecode(path, layers, STORIES_PROMPT_TOKENS, n, rounds);
  const runs: LabRun[] = [];
  for (const rtt of rtts) {
    const r = await labRun(path, kind, rtt, STORIES_PROMPT_TOKENS, n, rounds);
    const fromSingle = predictDecodeMs(single.best, layers, single.head, r.stages.map((s) => ({ ...s, slow: 1 })));
    const run = predictFromRun(r.median_step, r.stages.map((s) => s.delayMs), r.loopbackHopMs);
    runs.push({ ...r, predicted_ms_per_token: round(run.predicted_ms_per_token), prediction: run.terms, predicted_from_single_ms_per_token: round(fromSingle), within_prediction: round(r.median_step.ms / run.predicted_ms_per_token, 3), within_prediction_best_round: round(r.decode_ms_per_token / run.predicted_ms_per_token, 3), same_tokens_as_single: JSON.stringify(r.tokens) === JSON.stringify(single.tokens.slice(0, r.tokens.length)) });
  }
  const goals = runs.map((r) => goal(`|lab decode over ${r.stages.length} ${r.stage_kind} stages at +${r.added_rtt_ms} ms RTT / prediction − 1|`, Math.abs(r.within_prediction - 1), 'max', 0.1));
  return { model: { path, layers }, single_process_decode_ms_per_token: round(single.best, 3), runs, goals };
}

async function labRun(model: string, kind: StageKind, rtt: number, prompt: number[], n: number, rounds: number): Promise<Omit<LabRun, 'predicted_ms_per_token' | 'prediction' | 'predicted_from_single_ms_per_token' | 'within_prediction' | 'within_prediction_best_round' | 'same_tokens_as_single'>> {
  const delay = rtt / 4;
  const lab = await NetLab.create({ routed: { hosts: ['srv', ...NODES], links: Object.fromEntries(NODES.map((h) => [h, { delayMs: delay }])) } });
  const scratch = mkdtempSync(join(tmpdir(), 'gguf-mesh-wan-lab-'));
  const browsers: LabBrowser[] = [];
  try {
    const planning = ['--min-peers', String(NODES.length), '--plan-delay', '2000', '--standby', 'off', '--planner', 'memory'];
    let joinUrl: string;
    let serve: MeshProcess;
    const stages: LabRun['stages'] = [];
    if (kind === 'node') {
      const srv = lab.host('srv');
      serve = spawnMesh(['serve', '--host', srv.ip, '--port', '0', '--ui', 'off', '--model', model, ...planning, '--insecure-http'], { prefix: lab.exec('srv', []) });
      joinUrl = (await serve.waitFor(/join:\s+(\S+)/, 60_000))[1]!;
      const nodes = NODES.map((h) => spawnMesh(['node', '--join', joinUrl, '--backend', 'cpu', '--memory', '4GiB', '--name', h, '--listen', `${lab.host(h).ip}:0`], { prefix: lab.exec(h, []) }));
      for (const [i, node] of nodes.entries()) {
        const [, stage, a, b] = await node.waitFor(/stage (\d+) of route \d+: layers (\d+)-(\d+) ready/, 120_000);
        stages[Number(stage)] = { peer: NODES[i]!, layers: `${a}-${b}`, delayMs: delay };
      }
    } else {
      // HTTPS with serve's local CA (tabs get WebGPU in a secure context only), trusted by each tab's profile
      const served = await serveIn(lab, 'srv', model, join(scratch, 'serve-cache'), planning);
      serve = served.proc;
      joinUrl = served.joinUrl;
      const pages = [];
      for (const h of NODES) {
        browsers.push(await launchInHost(lab, h, [served.ca]));
        pages.push(await openRoomPage(browsers.at(-1)!, joinUrl, h));
      }
      const route = await readyRoute(pages[0]!, served, 120_000);
      for (const st of route.stages) stages[st.stage] = { peer: st.peerId, layers: `${st.shard.start}-${st.shard.end}`, delayMs: delay };
    }
    const client = spawnCommand(lab.exec('srv', [process.execPath, 'bin/run-ts.js', 'bench/lib/lab-decode.ts', joinUrl, prompt.join(','), String(n), String(rounds)]), {}, 'lab-decode');
    const code = await client.exited;
    const line = client.output().trim().split('\n').filter((l) => l.startsWith('{')).at(-1);
    if (code !== 0 || !line) throw new Error(`lab-decode exited with ${code}:\n${client.output()}\n${serve.output()}`);
    const { direct, climb, ring, tokens, steps, hopRoundTrips } = JSON.parse(line) as { direct: number; climb: number; ring: number; tokens: number[]; steps: StepCost[]; hopRoundTrips: number[][] };
    // a climbing hop's round trip crosses both nodes' links twice (the delay is on the wire here, not in a stage's handling)
    const loopbackHopMs = median(hopRoundTrips.flat().map((ms) => (ms - 4 * delay) / 2));
    return { added_rtt_ms: rtt, stage_kind: kind, link_delay_ms: { serve: 0, node: delay }, stages: stages.filter(Boolean), decode_ms_per_token: round(direct), climbing_path_ms_per_token: round(climb), ring_ms_per_token: round(ring), tokens, median_step: medianStep(steps), loopbackHopMs };
  } finally {
    for (const b of browsers) await b.close();
    await killAll();
    lab.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}
