// `npm run bench -- wan-lab [--n 32 --rounds 3 --rtt 0,40]` (root: network namespaces)
// A real route across the routed lab (test/support/netns.ts): `serve` and the client (bench wan's
// decode rounds, bench/lib/lab-decode.ts; plain HTTP: the lab is the test's own) in one namespace, two `gguf-mesh node` processes in two others, every
// packet between them through the router's shaper — the latency is on the wire, not in the
// nodes (bench wan's --test-link-delay-ms). For each added RTT, each node's link gets rtt/4 of
// delay (node to node rtt of round trip, server to node rtt/2; the server's link none, as in
// bench wan's sweep): decode ms/token (best of the rounds; one-way token path, the climbing one beside it) beside bench wan's prediction
// (Σ compute from the single process measured in the same run + every hop's delay), on stories260K.
import { configFromHeader } from '../src/model/config.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { NetLab } from '../test/support/netns.ts';
import { killAll, spawnCommand, spawnMesh } from '../test/support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from '../test/support/models.ts';
import { arg } from './route.ts';
import { predictDecodeMs, singleProcessDecode } from './wan.ts';

const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;
const NODES = ['n1', 'n2'];

interface LabRun {
  added_rtt_ms: number;
  link_delay_ms: { serve: number; node: number };
  stages: Array<{ peer: string; layers: string; delayMs: number }>;
  /** best round, the one-way token path (N + 1 hops) */
  decode_ms_per_token: number;
  /** best round, the token climbing back through every stage (2N hops) */
  climbing_path_ms_per_token: number;
  predicted_ms_per_token: number;
  within_prediction: number;
  tokens: number[];
  same_tokens_as_single: boolean;
}

export async function run(args: string[]): Promise<unknown> {
  const path = await stories260K();
  const n = arg(args, 'n', 32);
  const rounds = arg(args, 'rounds', 3);
  const rtts = (args.includes('--rtt') ? args[args.indexOf('--rtt') + 1] ?? '' : '0,40').split(',').map(Number);
  if (rtts.some((x) => !(x >= 0))) throw new Error(`--rtt must be a comma-separated list of ms ≥ 0, got ${args[args.indexOf('--rtt') + 1]}`);
  const source = await openTensorSource(path);
  const layers = configFromHeader(source.header).nLayer;
  await source.close();
  const single = await singleProcessDecode(path, layers, STORIES_PROMPT_TOKENS, n, rounds);
  const runs: LabRun[] = [];
  for (const rtt of rtts) {
    const r = await labRun(path, rtt, STORIES_PROMPT_TOKENS, n, rounds);
    const predicted = predictDecodeMs(single.best, layers, single.head, r.stages.map((s) => ({ ...s, slow: 1 })));
    runs.push({ ...r, predicted_ms_per_token: round(predicted), within_prediction: round(r.decode_ms_per_token / predicted, 3), same_tokens_as_single: JSON.stringify(r.tokens) === JSON.stringify(single.tokens.slice(0, r.tokens.length)) });
  }
  return { model: { path, layers }, single_process_decode_ms_per_token: round(single.best, 3), runs };
}

async function labRun(model: string, rtt: number, prompt: number[], n: number, rounds: number): Promise<Omit<LabRun, 'predicted_ms_per_token' | 'within_prediction' | 'same_tokens_as_single'>> {
  const delay = rtt / 4;
  const lab = await NetLab.create({ routed: { hosts: ['srv', ...NODES], links: Object.fromEntries(NODES.map((h) => [h, { delayMs: delay }])) } });
  try {
    const srv = lab.host('srv');
    const serve = spawnMesh(['serve', '--host', srv.ip, '--port', '0', '--ui', 'off', '--model', model, '--min-peers', String(NODES.length), '--plan-delay', '2000', '--standby', 'off', '--planner', 'memory', '--insecure-http'], { prefix: lab.exec('srv', []) });
    const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/, 60_000);
    const stages: LabRun['stages'] = [];
    const nodes = NODES.map((h) => spawnMesh(['node', '--join', joinUrl!, '--backend', 'cpu', '--memory', '4GiB', '--name', h, '--listen', `${lab.host(h).ip}:0`], { prefix: lab.exec(h, []) }));
    for (const [i, node] of nodes.entries()) {
      const [, stage, a, b] = await node.waitFor(/stage (\d+) of route \d+: layers (\d+)-(\d+) ready/, 120_000);
      stages[Number(stage)] = { peer: NODES[i]!, layers: `${a}-${b}`, delayMs: delay };
    }
    const client = spawnCommand(lab.exec('srv', [process.execPath, 'bin/run-ts.js', 'bench/lib/lab-decode.ts', joinUrl!, prompt.join(','), String(n), String(rounds)]), {}, 'lab-decode');
    const code = await client.exited;
    const line = client.output().trim().split('\n').filter((l) => l.startsWith('{')).at(-1);
    if (code !== 0 || !line) throw new Error(`lab-decode exited with ${code}:\n${client.output()}\n${serve.output()}`);
    const { direct, climb, tokens } = JSON.parse(line) as { direct: number; climb: number; tokens: number[] };
    return { added_rtt_ms: rtt, link_delay_ms: { serve: 0, node: delay }, stages: stages.filter(Boolean), decode_ms_per_token: round(direct), climbing_path_ms_per_token: round(climb), tokens };
  } finally {
    await killAll();
    lab.close();
  }
}
