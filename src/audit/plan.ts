// Shard planning: cut a model's main blocks into contiguous ranges, one per peer, in the order
// the peers are given (that order is the route). Each stage must fit in a fixed fraction of its
// peer's memory: weights + KV for the planned context + fixed per-session state. Among all
// assignments that fit, the planner picks the one whose fullest stage is least full (minimax
// over fill), by dynamic programming over (peer, cut) — O(peers × blocks²), cheap for the
// ≤ 100 blocks of real models. Boundary rules come from the model geometry: stages start
// where no extra data must cross the wire, and only if that cannot fit is the rule relaxed
// (the stage is then marked with what it must receive).

import { isExpertTensor } from '../gguf/summary.ts';
import type { ModelGeometry } from './geometry.ts';
import { formatBytes } from '../units.ts';

export type PeerKind = 'browser' | 'native';

export interface PeerSpec {
  kind: PeerKind;
  /** bytes of memory the peer offers (GPU memory for a browser, RAM for a native peer) */
  memory: number;
}

export interface PlanOptions {
  /** tokens of context the KV cache of every stage must hold */
  context: number;
  /** share of a peer's memory a stage may fill (the rest: activations, runtime, browser) */
  budgetFraction: number;
  /** largest storage binding a browser peer's WebGPU device gives one buffer */
  maxBindingBytes: number;
}

export const DEFAULT_PLAN_OPTIONS: PlanOptions = {
  context: 4096,
  budgetFraction: 0.75,
  // the WebGPU default maxStorageBufferBindingSize; devices may grant more when asked
  maxBindingBytes: 128 * 1024 * 1024,
};

export interface SplitTensor {
  name: string;
  bytes: number;
  /** storage buffers the tensor is cut into, by rows (ne1…, i.e. per expert for 3-D tensors) */
  pieces: number;
}

export interface PlannedStage {
  /** index into the peer list */
  peer: number;
  kind: PeerKind;
  memory: number;
  /** main blocks [start, end) */
  start: number;
  end: number;
  holdsEmbedding: boolean;
  holdsHead: boolean;
  weightBytes: number;
  kvBytes: number;
  stateBytes: number;
  totalBytes: number;
  budgetBytes: number;
  /** totalBytes / budgetBytes */
  fill: number;
  /** the stage starts inside the token-id–routed blocks and must receive the token ids */
  needsTokenIds: boolean;
  /** the stage starts where the boundary rule wanted no start; it receives `penaltyWhat` */
  needsStartPenalty: boolean;
  /** bytes per token this stage receives from the previous one (0 for stage 0) */
  inboundBytesPerToken: number;
  /** tensors over the browser binding limit and how they are cut */
  splitTensors: SplitTensor[];
}

export interface ShardPlan {
  feasible: boolean;
  /** why no plan fits, when infeasible */
  reason: string | null;
  stages: PlannedStage[];
  /** indices of peers that got no blocks */
  unusedPeers: number[];
  /** the start rules had to be relaxed (stages marked needsStartPenalty or needsTokenIds) */
  relaxedStarts: boolean;
  options: PlanOptions;
}

interface Costs {
  n: number;
  /** prefix sums over blocks */
  weight: number[];
  kv: number[];
  state: number[];
  /** per block: largest row of any tensor (browser stages need every row ≤ the binding) */
  maxRowBytes: number[];
}

function prefix(values: readonly number[]): number[] {
  const out = [0];
  for (const v of values) out.push(out[out.length - 1]! + v);
  return out;
}

/**
 * The bytes of a tensor's smallest piece the WebGPU backend can give its own binding: one row
 * of a matrix, one expert of a 3-D expert tensor (its kernels address whole experts).
 */
function rowBytes(t: { name: string; byteLength: number; shape: readonly number[]; nElements: number }): number {
  if (isExpertTensor(t.name) && t.shape.length === 3) return t.byteLength / t.shape[2]!;
  const rows = t.nElements / (t.shape[0] ?? 1);
  return rows > 0 ? t.byteLength / rows : t.byteLength;
}

function costs(g: ModelGeometry, opts: PlanOptions): Costs {
  return {
    n: g.nLayer,
    weight: prefix(g.blocks.map((b) => b.bytes)),
    kv: prefix(g.kvBytesPerToken.map((b) => b * opts.context)),
    state: prefix(g.fixedStateBytes),
    maxRowBytes: g.blocks.map((b) => Math.max(0, ...b.tensors.map(rowBytes))),
  };
}

interface StageBytes {
  weight: number;
  kv: number;
  state: number;
  total: number;
}

function stageBytes(g: ModelGeometry, c: Costs, start: number, end: number): StageBytes {
  let weight = c.weight[end]! - c.weight[start]! + g.global.bytes;
  if (start === 0) weight += g.embed.bytes;
  if (end === c.n) weight += g.head.bytes + (g.tiedHead && start > 0 ? g.embed.bytes : 0);
  const kv = c.kv[end]! - c.kv[start]!;
  const state = c.state[end]! - c.state[start]!;
  return { weight, kv, state, total: weight + kv + state };
}

/** Tensors of a stage and their largest row, for the browser binding check. */
function stageTensors(g: ModelGeometry, start: number, end: number) {
  const ts = g.blocks.slice(start, end).flatMap((b) => b.tensors).concat(g.global.tensors);
  if (start === 0) ts.push(...g.embed.tensors);
  if (end === g.nLayer) ts.push(...g.head.tensors, ...(g.tiedHead && start > 0 ? g.embed.tensors : []));
  return ts;
}

function splitsFor(g: ModelGeometry, start: number, end: number, maxBinding: number): SplitTensor[] {
  return stageTensors(g, start, end)
    .filter((t) => t.byteLength > maxBinding)
    .map((t) => {
      const rb = rowBytes(t);
      const rows = t.byteLength / rb; // rows, or experts
      const perPiece = Math.max(1, Math.floor(maxBinding / rb));
      return { name: t.name, bytes: t.byteLength, pieces: Math.ceil(rows / perPiece) };
    });
}

/**
 * What the planner optimises: 'balance' uses the given peers so the fullest stage is as empty
 * as possible (more stages on a tie); 'fewest' uses as few stages (hops) as fit, then balances.
 */
export type PlanObjective = 'balance' | 'fewest';

/** Plans `peers` (in route order) over the model, or says why no plan fits. */
export function planShards(
  g: ModelGeometry,
  peers: readonly PeerSpec[],
  options: Partial<PlanOptions> = {},
  objective: PlanObjective = 'balance',
): ShardPlan {
  const opts: PlanOptions = { ...DEFAULT_PLAN_OPTIONS, ...options };
  const c = costs(g, opts);
  const strict = solve(g, c, peers, opts, true, objective);
  if (strict) return strict;
  if (g.freeStarts || g.tokenIdBlocks.length > 1) {
    const relaxed = solve(g, c, peers, opts, false, objective);
    if (relaxed) return relaxed;
  }
  return { feasible: false, reason: whyNothingFits(g, c, peers, opts), stages: [], unusedPeers: peers.map((_, i) => i), relaxedStarts: false, options: opts };
}

/** In the strict pass a stage may only start where nothing extra must reach it. */
function startAllowed(g: ModelGeometry, start: number, strict: boolean): boolean {
  if (start === 0 || !strict) return true;
  if (g.tokenIdBlocks.includes(start)) return false; // would need the token ids forwarded
  return g.freeStarts === null || g.freeStarts.has(start);
}

/** Is (worst, stages) a better assignment than (curWorst, curStages) under the objective? */
function better(objective: PlanObjective, worst: number, stages: number, curWorst: number, curStages: number): boolean {
  if (curWorst === Infinity) return worst < Infinity;
  const tie = Math.abs(worst - curWorst) <= 1e-12 * Math.max(1, curWorst);
  if (objective === 'fewest') return stages < curStages || (stages === curStages && !tie && worst < curWorst);
  return (!tie && worst < curWorst) || (tie && stages > curStages);
}

function solve(
  g: ModelGeometry,
  c: Costs,
  peers: readonly PeerSpec[],
  opts: PlanOptions,
  strict: boolean,
  objective: PlanObjective,
): ShardPlan | null {
  const n = c.n;
  const k = peers.length;
  if (n === 0 || k === 0) return null;
  // best[j][e]: least possible fullest-stage fill placing blocks [0, e) on peers [0, j)
  const best: number[][] = Array.from({ length: k + 1 }, () => new Array<number>(n + 1).fill(Infinity));
  const from: number[][] = Array.from({ length: k + 1 }, () => new Array<number>(n + 1).fill(-1));
  // stages used by the best assignment (the second criterion of the objective)
  const used: number[][] = Array.from({ length: k + 1 }, () => new Array<number>(n + 1).fill(0));
  best[0]![0] = 0;
  const budgets = peers.map((p) => p.memory * opts.budgetFraction);
  for (let j = 1; j <= k; j++) {
    const peer = peers[j - 1]!;
    const budget = budgets[j - 1]!;
    for (let e = 0; e <= n; e++) {
      // peer j-1 unused
      best[j]![e] = best[j - 1]![e]!;
      from[j]![e] = e;
      used[j]![e] = used[j - 1]![e]!;
      // grow the stage [s, e) backwards; once it cannot fit, no longer range can
      for (let s = e - 1; s >= 0; s--) {
        if (peer.kind === 'browser' && c.maxRowBytes[s]! > opts.maxBindingBytes) break;
        const fill = stageBytes(g, c, s, e).total / budget;
        if (fill > 1) break;
        const prev = best[j - 1]![s]!;
        if (prev === Infinity || !startAllowed(g, s, strict)) continue;
        const worst = Math.max(prev, fill);
        if (better(objective, worst, used[j - 1]![s]! + 1, best[j]![e]!, used[j]![e]!)) {
          best[j]![e] = worst;
          from[j]![e] = s;
          used[j]![e] = used[j - 1]![s]! + 1;
        }
      }
    }
  }
  if (best[k]![n] === Infinity) return null;
  const stages: PlannedStage[] = [];
  const unused: number[] = [];
  let e = n;
  for (let j = k; j >= 1; j--) {
    const s = from[j]![e]!;
    if (s === e) {
      unused.push(j - 1);
      continue;
    }
    stages.push(makeStage(g, c, peers, opts, j - 1, s, e));
    e = s;
  }
  stages.reverse();
  unused.reverse();
  for (let i = 1; i < stages.length; i++) {
    const st = stages[i]!;
    st.inboundBytesPerToken =
      g.hopBytesPerToken + (st.needsTokenIds ? 4 : 0) + (st.needsStartPenalty ? g.startPenaltyBytesPerToken : 0);
  }
  return {
    feasible: true,
    reason: null,
    stages,
    unusedPeers: unused,
    relaxedStarts: stages.some((s) => s.needsStartPenalty || s.needsTokenIds),
    options: opts,
  };
}

function makeStage(g: ModelGeometry, c: Costs, peers: readonly PeerSpec[], opts: PlanOptions, peer: number, start: number, end: number): PlannedStage {
  const p = peers[peer]!;
  const bytes = stageBytes(g, c, start, end);
  const budget = p.memory * opts.budgetFraction;
  const lastTokenBlock = g.tokenIdBlocks.length ? Math.max(...g.tokenIdBlocks) : -1;
  return {
    peer,
    kind: p.kind,
    memory: p.memory,
    start,
    end,
    holdsEmbedding: start === 0 || (end === g.nLayer && g.tiedHead),
    holdsHead: end === g.nLayer,
    weightBytes: bytes.weight,
    kvBytes: bytes.kv,
    stateBytes: bytes.state,
    totalBytes: bytes.total,
    budgetBytes: budget,
    fill: bytes.total / budget,
    needsTokenIds: start > 0 && start <= lastTokenBlock,
    needsStartPenalty: start > 0 && g.freeStarts !== null && !g.freeStarts.has(start),
    inboundBytesPerToken: 0,
    splitTensors: p.kind === 'browser' ? splitsFor(g, start, end, opts.maxBindingBytes) : [],
  };
}

const GiB = 1024 ** 3;
const gib = (n: number) => `${(n / GiB).toFixed(2)} GiB`;

/** One sentence on the tightest reason a plan cannot exist. */
function whyNothingFits(g: ModelGeometry, c: Costs, peers: readonly PeerSpec[], opts: PlanOptions): string {
  if (peers.length === 0) return 'no peers given';
  if (c.n === 0) return 'the model has no blocks';
  const budgets = peers.map((p) => p.memory * opts.budgetFraction);
  const largest = Math.max(...budgets);
  const pct = Math.round(opts.budgetFraction * 100);
  // the smallest unit a stage must hold whole: one block (plus embedding/head at the ends)
  for (let i = 0; i < c.n; i++) {
    const one = stageBytes(g, c, i, i + 1).total;
    if (one > largest) {
      return `block ${i} alone needs ${gib(one)} (weights, KV for ${opts.context} tokens, state${i === 0 ? ', embedding' : ''}${i === c.n - 1 ? ', head' : ''}) but the largest peer may use ${gib(largest)} (${pct}% of its memory)`;
    }
  }
  const total = stageBytes(g, c, 0, c.n).total;
  const sum = budgets.reduce((a, b) => a + b, 0);
  if (total > sum) {
    return `the model needs ${gib(total)} for ${opts.context} tokens of context but the ${peers.length} peers may use ${gib(sum)} together (${pct}% of their memory)`;
  }
  if (peers.every((p) => p.kind === 'browser') && c.maxRowBytes.some((r) => r > opts.maxBindingBytes)) {
    return `a tensor row exceeds the browser binding limit of ${formatBytes(opts.maxBindingBytes)}; add a native peer`;
  }
  return `no contiguous assignment of the ${c.n} blocks to the peers in the given order fits; put larger peers where the larger blocks are, or add peers`;
}
