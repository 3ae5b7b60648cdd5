// The audit of one GGUF header: what each backend can run, what the model costs per block,
// per token of context and per hop, and (given peers) a shard plan. Pure: header in, report
// out; the command prints it. Key names are snake_case because they are the JSON output
// documented in `gguf-mesh audit --help`.

import { isMeshError } from '../errors.ts';
import type { GgmlType, GgufHeader } from '../gguf/types.ts';
import { hyperParameters } from '../gguf/summary.ts';
import { configFromHeader } from '../model/config.ts';
import { checkedServableModel } from '../model/model-check.ts';
import { ggmlTypeName } from '../gguf/traits.ts';
import { ARCH_OPS, BACKEND_ARCHS, BACKEND_OPS, BACKEND_TYPES, OPS, missingOps } from './ops.ts';
import type { OpId } from './ops.ts';
import { activeWeightBytesPerToken, modelGeometry } from './geometry.ts';
import type { ModelGeometry } from './geometry.ts';
import { planShards } from './plan.ts';
import { backendCapability } from '../backends/capabilities.ts';
import { modelTraits, servable } from '../model/serve-capability.ts';
import type { Servable } from '../model/serve-capability.ts';
import type { PeerSpec, PlanOptions, ShardPlan } from './plan.ts';

export interface BackendSupport {
  /** the backend runs this architecture */
  architecture: boolean;
  /** ops the architecture needs that the backend lacks; null when no op table knows it */
  missing_ops: OpId[] | null;
  /** tensor types in the file the backend cannot read */
  unsupported_types: string[];
  /** architecture, ops and types all supported */
  ready: boolean;
  notes: string[];
}

export interface TypeRow {
  type: string;
  tensors: number;
  bytes: number;
  cpu: boolean;
  webgpu: boolean;
  llamacpp: boolean;
}

export interface StageReport {
  peer: number;
  kind: 'browser' | 'native';
  memory: number;
  /** main blocks [start, end) */
  start: number;
  end: number;
  holds_embedding: boolean;
  holds_head: boolean;
  weight_bytes: number;
  kv_bytes: number;
  state_bytes: number;
  total_bytes: number;
  budget_bytes: number;
  fill: number;
  inbound_bytes_per_token: number;
  needs_token_ids: boolean;
  needs_start_penalty: boolean;
  split_tensors: { name: string; bytes: number; pieces: number }[];
  /** backend the stage would run on: webgpu (browser), llamacpp (native: whole model, or a range of llama/qwen2/qwen3) or cpu (native, other ranges) */
  backend: 'webgpu' | 'llamacpp' | 'cpu';
  /** why that backend cannot serve this stage today (empty when it can) */
  blockers: string[];
}

export interface PlanReport {
  feasible: boolean;
  reason: string | null;
  context: number;
  budget_fraction: number;
  max_binding_bytes: number;
  relaxed_starts: boolean;
  unused_peers: number[];
  stages: StageReport[];
  /** bytes on the wire per decoded token, summed over every boundary */
  wire_bytes_per_token: number;
  /** every stage's backend is ready for it */
  runnable_now: boolean;
  /** the fewest stages (hops + 1) any plan over these peers needs, and its ranges; null if none fits */
  fewest_stages: { stages: number; ranges: { peer: number; start: number; end: number }[] } | null;
}

/** Whether `serve` takes the model: it (and every backend here) reads it through configFromHeader. */
export interface ServeCheck {
  accepted: boolean;
  /** the MeshError code a room for it fails with, when not accepted */
  code: string | null;
  reason: string | null;
}

export interface AuditReport {
  location: string;
  architecture: string;
  serve: ServeCheck;
  n_layer: number;
  n_layer_nextn: number;
  n_embd: number;
  hc_streams: number;
  tensor_count: number;
  file_bytes: number;
  backends: { cpu: BackendSupport; webgpu: BackendSupport; llamacpp: BackendSupport };
  tensor_types: TypeRow[];
  /** every op the architecture uses, with per-backend support */
  ops: { op: OpId; what: string; cpu: boolean; webgpu: boolean }[];
  layer_bytes: number[];
  embed_bytes: number;
  head_bytes: number;
  /** optional MTP blocks, not placed by the plan (they would join the last stage) */
  mtp_bytes: number;
  global_bytes: number;
  largest_tensor: { name: string; bytes: number } | null;
  /** bytes of routed-expert tensors over all blocks (0 for dense models) */
  expert_bytes: number;
  /** weight bytes one decoded token reads: non-expert weights, the routed experts' share, the head */
  active_weight_bytes_per_token: number;
  kv_bytes_per_token: number;
  kv_bytes_per_token_per_layer: number[];
  fixed_state_bytes: number;
  hop_bytes_per_token: number;
  boundaries: {
    free_starts: number[] | null;
    token_id_blocks: number[];
    start_penalty_bytes_per_token: number;
    notes: string[];
  };
  plan: PlanReport | null;
}

function typeRows(header: GgufHeader): TypeRow[] {
  const rows = new Map<number, TypeRow>();
  for (const t of header.tensors) {
    let row = rows.get(t.type);
    if (!row) {
      row = {
        type: ggmlTypeName(t.type),
        tensors: 0,
        bytes: 0,
        cpu: BACKEND_TYPES.cpu.has(t.type),
        webgpu: BACKEND_TYPES.webgpu.has(t.type),
        llamacpp: true,
      };
      rows.set(t.type, row);
    }
    row.tensors++;
    row.bytes += t.byteLength;
  }
  return [...rows.values()].sort((a, b) => b.bytes - a.bytes);
}

function support(g: ModelGeometry, types: TypeRow[], backend: 'cpu' | 'webgpu'): BackendSupport {
  const architecture = BACKEND_ARCHS[backend].has(g.architecture);
  const missing = missingOps(g.architecture, backend) ?? null;
  const unsupported = types.filter((t) => !t[backend]).map((t) => t.type);
  const notes: string[] = [];
  if (missing === null) notes.push(`no operation table for architecture '${g.architecture}'`);
  return {
    architecture,
    missing_ops: missing,
    unsupported_types: unsupported,
    ready: architecture && missing !== null && missing.length === 0 && unsupported.length === 0,
    notes,
  };
}

function vocabSize(header: GgufHeader): number {
  const tokens = header.metadata['tokenizer.ggml.tokens'];
  return Array.isArray(tokens) ? tokens.length : (header.tensors.find((t) => t.name === 'token_embd.weight')?.shape[1] ?? 0);
}

/** `check` as a verdict: accepted, or refused with the MeshError's code and message. */
function verdict(check: () => unknown): ServeCheck {
  try {
    check();
    return { accepted: true, code: null, reason: null };
  } catch (e) {
    if (!isMeshError(e)) throw e;
    return { accepted: false, code: e.code, reason: e.message };
  }
}

/** Whether `serve` opens a room for the model: its own check (any architecture: a whole-model llama.cpp node may serve it; a file that lies is refused). */
function serveCheck(header: GgufHeader): ServeCheck {
  return verdict(() => checkedServableModel(header));
}

/** Whether the CPU and WebGPU engines take the model: both load through configFromHeader. */
function engineCheck(header: GgufHeader): ServeCheck {
  return verdict(() => configFromHeader(header));
}

/** A backend is ready only where the check passes: the reason joins its notes. */
function gated(b: BackendSupport, check: ServeCheck, who: string): BackendSupport {
  if (check.accepted) return b;
  return { ...b, ready: false, notes: [...b.notes, `${who} refuses the model (${check.code}): ${check.reason}`] };
}

/** What a llama.cpp node may be given of this model: the rule `serve` plans with (model/serve-capability.ts). */
function llamacppServable(header: GgufHeader): Servable {
  return servable(backendCapability('llamacpp'), modelTraits(header));
}

function llamacppSupport(g: ModelGeometry, header: GgufHeader): BackendSupport {
  const can = llamacppServable(header);
  const notes = [
    can.ranges
      ? 'serves any layer range (a shard GGUF run by llama.cpp, src/backends/llamacpp/range-stage.ts)'
      : `serves '${g.architecture}' as the whole model only (one stage); its layer-range path runs ${backendCapability('llamacpp').rangeArchitectures.join(', ')}`,
  ];
  if (g.hcStreams > 1) {
    notes.push(`llama.cpp takes n_embd-wide input embeddings only: a middle or last stage cannot receive the ${g.hcStreams}-stream state`);
  }
  return { architecture: can.wholeModel, missing_ops: [], unsupported_types: [], ready: can.wholeModel, notes };
}

/** Names of the tensors a stage holds. */
function stageTensorNames(g: ModelGeometry, s: ShardPlan['stages'][number]): Set<string> {
  return new Set(
    g.blocks.slice(s.start, s.end).flatMap((blk) => blk.tensors.map((t) => t.name))
      .concat(s.holdsEmbedding ? g.embed.tensors.map((t) => t.name) : [])
      .concat(s.holdsHead ? g.head.tensors.map((t) => t.name) : [])
      .concat(g.global.tensors.map((t) => t.name)),
  );
}

/**
 * The backend a stage would run on and what stops it today. Browsers run WebGPU. A native peer
 * runs llama.cpp for a whole model, and for a layer range where llama.cpp's range path serves
 * the architecture; otherwise the CPU reference engine.
 */
function stageBackend(
  g: ModelGeometry,
  report: Pick<AuditReport, 'backends' | 'serve'>,
  header: GgufHeader,
  s: ShardPlan['stages'][number],
): { backend: StageReport['backend']; blockers: string[] } {
  const out: string[] = [];
  let backend: StageReport['backend'];
  const unreadable = (types: ReadonlySet<GgmlType>) => {
    const names = stageTensorNames(g, s);
    return [...new Set(header.tensors.filter((t) => names.has(t.name) && !types.has(t.type)).map((t) => ggmlTypeName(t.type)))];
  };
  if (s.kind === 'browser') {
    backend = 'webgpu';
    const b = report.backends.webgpu;
    if (!b.architecture) out.push(`WebGPU backend does not run '${g.architecture}'`);
    if (b.missing_ops?.length) out.push(`WGSL lacks: ${b.missing_ops.join(', ')}`);
    const bad = unreadable(BACKEND_TYPES.webgpu);
    if (bad.length) out.push(`WGSL cannot read ${bad.join(', ')}`);
  } else if (s.start === 0 && s.holdsHead) {
    backend = 'llamacpp';
    if (!report.backends.llamacpp.architecture) out.push(`the bundled llama.cpp does not know '${g.architecture}'`);
  } else if (llamacppServable(header).ranges) {
    backend = 'llamacpp';
  } else if (report.backends.cpu.architecture && report.backends.cpu.missing_ops?.length === 0 && unreadable(BACKEND_TYPES.cpu).length === 0) {
    backend = 'cpu';
  } else {
    backend = 'llamacpp';
    out.push(`llama.cpp serves '${g.architecture}' as the whole model only; its layer-range path runs ${backendCapability('llamacpp').rangeArchitectures.join(', ')}`);
    if (g.hcStreams > 1 && s.start > 0) out.push(`llama.cpp takes n_embd-wide embeddings, not the ${g.hcStreams}-stream hyper-connection state`);
    const cpu = report.backends.cpu;
    if (cpu.missing_ops === null || !cpu.architecture) out.push(`the CPU engine does not run '${g.architecture}'`);
    else if (cpu.missing_ops.length) out.push(`the CPU engine lacks: ${cpu.missing_ops.join(', ')}`);
    const bad = unreadable(BACKEND_TYPES.cpu);
    if (bad.length) out.push(`the CPU engine cannot read ${bad.join(', ')}`);
  }
  if (!report.serve.accepted) out.push(`serve refuses the model (${report.serve.code})`);
  if (s.needsTokenIds) out.push('needs the token ids forwarded from stage 0 (hash-routed blocks)');
  if (s.needsStartPenalty) out.push(`starts on a shared-indexer block: needs ${g.startPenaltyWhat} per token from the previous stage`);
  return { backend, blockers: out };
}

export interface AuditOptions {
  peers?: readonly PeerSpec[];
  plan?: Partial<PlanOptions>;
}

/** Audits a parsed header; `location` only names the file in the report. */
export function auditHeader(header: GgufHeader, location: string, opts: AuditOptions = {}): AuditReport {
  const g = modelGeometry(header, location);
  const types = typeRows(header);
  const serve = serveCheck(header);
  const engines = engineCheck(header);
  const backends = {
    cpu: gated(gated(support(g, types, 'cpu'), engines, 'the CPU engine'), serve, 'serve'),
    webgpu: gated(gated(support(g, types, 'webgpu'), engines, 'the WebGPU engine'), serve, 'serve'),
    llamacpp: gated(llamacppSupport(g, header), serve, 'serve'),
  };
  const needed = [...new Set(ARCH_OPS[g.architecture] ?? [])];
  const largest = header.tensors.reduce<{ name: string; bytes: number } | null>(
    (m, t) => (m && m.bytes >= t.byteLength ? m : { name: t.name, bytes: t.byteLength }),
    null,
  );
  const report: AuditReport = {
    location,
    architecture: g.architecture,
    serve,
    n_layer: g.nLayer,
    n_layer_nextn: g.nLayerNextn,
    n_embd: g.nEmbd,
    hc_streams: g.hcStreams,
    tensor_count: header.tensors.length,
    file_bytes: header.fileBytes,
    backends,
    tensor_types: types,
    ops: needed.map((op) => ({ op, what: OPS[op], cpu: BACKEND_OPS.cpu.has(op), webgpu: BACKEND_OPS.webgpu.has(op) })),
    layer_bytes: g.blocks.map((b) => b.bytes),
    embed_bytes: g.embed.bytes,
    head_bytes: g.head.bytes,
    mtp_bytes: g.mtp.bytes,
    global_bytes: g.global.bytes,
    largest_tensor: largest,
    expert_bytes: g.expertBytes.reduce((a, b) => a + b, 0),
    active_weight_bytes_per_token: Math.round(activeWeightBytesPerToken(g, vocabSize(header))),
    kv_bytes_per_token: g.kvBytesPerToken.reduce((a, b) => a + b, 0),
    kv_bytes_per_token_per_layer: g.kvBytesPerToken,
    fixed_state_bytes: g.fixedStateBytes.reduce((a, b) => a + b, 0),
    hop_bytes_per_token: g.hopBytesPerToken,
    boundaries: {
      free_starts: g.freeStarts ? [...g.freeStarts].sort((a, b) => a - b) : null,
      token_id_blocks: g.tokenIdBlocks,
      start_penalty_bytes_per_token: g.startPenaltyBytesPerToken,
      notes: g.notes,
    },
    plan: null,
  };
  if (opts.peers) {
    const plan = planShards(g, opts.peers, opts.plan);
    const fewest = plan.feasible ? planShards(g, opts.peers, opts.plan, 'fewest') : null;
    const stages: StageReport[] = plan.stages.map((s) => ({
      peer: s.peer,
      kind: s.kind,
      memory: s.memory,
      start: s.start,
      end: s.end,
      holds_embedding: s.holdsEmbedding,
      holds_head: s.holdsHead,
      weight_bytes: s.weightBytes,
      kv_bytes: s.kvBytes,
      state_bytes: s.stateBytes,
      total_bytes: s.totalBytes,
      budget_bytes: s.budgetBytes,
      fill: s.fill,
      inbound_bytes_per_token: s.inboundBytesPerToken,
      needs_token_ids: s.needsTokenIds,
      needs_start_penalty: s.needsStartPenalty,
      split_tensors: s.splitTensors,
      ...stageBackend(g, report, header, s),
    }));
    report.plan = {
      feasible: plan.feasible,
      reason: plan.reason,
      context: plan.options.context,
      budget_fraction: plan.options.budgetFraction,
      max_binding_bytes: plan.options.maxBindingBytes,
      relaxed_starts: plan.relaxedStarts,
      unused_peers: plan.unusedPeers,
      stages,
      wire_bytes_per_token: stages.reduce((a, s) => a + s.inbound_bytes_per_token, 0),
      runnable_now: plan.feasible && stages.every((s) => s.blockers.length === 0),
      fewest_stages: fewest?.feasible
        ? { stages: fewest.stages.length, ranges: fewest.stages.map((s) => ({ peer: s.peer, start: s.start, end: s.end })) }
        : null,
    };
  }
  return report;
}
