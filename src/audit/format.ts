// Text rendering of an AuditReport for the terminal.

import type { AuditReport, BackendSupport } from './report.ts';
import { formatBytes } from '../units.ts';

const yes = (b: boolean) => (b ? 'yes' : 'no');

function backendLine(name: string, b: BackendSupport): string {
  const parts = [`architecture ${yes(b.architecture)}`];
  if (b.missing_ops === null) parts.push('ops unknown');
  else if (b.missing_ops.length) parts.push(`missing ops: ${b.missing_ops.join(', ')}`);
  if (b.unsupported_types.length) parts.push(`unreadable types: ${b.unsupported_types.join(', ')}`);
  return `  ${name.padEnd(9)} ${b.ready ? 'READY' : 'NOT READY'} — ${parts.join('; ')}`;
}

/** Block indices as "0-4", "2, 4 … 42 (every 2nd)" or a short list. */
function indexList(ix: readonly number[]): string {
  if (ix.length === 1) return `${ix[0]}`;
  const step = ix[1]! - ix[0]!;
  const progression = ix.every((v, i) => i === 0 || v - ix[i - 1]! === step);
  if (progression && step === 1) return `${ix[0]}-${ix[ix.length - 1]}`;
  if (progression) return `${ix[0]}, ${ix[1]} … ${ix[ix.length - 1]} (every ${step})`;
  return ix.length <= 8 ? ix.join(', ') : `${ix.slice(0, 6).join(', ')} … (${ix.length} blocks)`;
}

/** Per-block values grouped by value, so 78 blocks read as a few lines. */
function byValue(values: readonly number[], show: (v: number) => string): string[] {
  const groups = new Map<number, number[]>();
  values.forEach((v, i) => groups.set(v, [...(groups.get(v) ?? []), i]));
  return [...groups.entries()]
    .sort((a, b) => a[1][0]! - b[1][0]!)
    .map(([v, ix]) => `    ${`block${ix.length > 1 ? 's' : ''} ${indexList(ix)}`.padEnd(34)} ${show(v)}`);
}

export function formatAudit(r: AuditReport): string {
  const L: string[] = [];
  L.push(`${r.location}`);
  L.push(`  architecture ${r.architecture}, ${r.n_layer} blocks${r.n_layer_nextn ? ` (+${r.n_layer_nextn} MTP)` : ''}, n_embd ${r.n_embd}` +
    `${r.hc_streams > 1 ? `, ${r.hc_streams} residual streams` : ''}, ${r.tensor_count} tensors, ${formatBytes(r.file_bytes)} file`);
  L.push(r.serve.accepted ? '  serve accepts it' : `  serve refuses it (${r.serve.code}): ${r.serve.reason}`);
  L.push('', 'backends');
  L.push(backendLine('cpu', r.backends.cpu), backendLine('webgpu', r.backends.webgpu), backendLine('llamacpp', r.backends.llamacpp));
  for (const [name, b] of Object.entries(r.backends)) for (const n of (b as BackendSupport).notes) L.push(`    ${name}: ${n}`);

  L.push('', 'tensor types                 tensors      bytes   cpu  webgpu  llamacpp');
  for (const t of r.tensor_types) {
    L.push(`  ${t.type.padEnd(24)} ${String(t.tensors).padStart(9)} ${formatBytes(t.bytes).padStart(10)}   ${yes(t.cpu).padEnd(4)} ${yes(t.webgpu).padEnd(7)} ${yes(t.llamacpp)}`);
  }

  if (r.ops.length) {
    L.push('', 'operations the architecture needs (cpu / webgpu)');
    for (const o of r.ops) L.push(`  ${o.cpu ? '+' : '-'} ${o.webgpu ? '+' : '-'}  ${o.op.padEnd(30)} ${o.what}`);
  } else {
    L.push('', `operations: no table for '${r.architecture}'`);
  }

  L.push('', 'bytes per block');
  L.push(...byValue(r.layer_bytes, (v) => `${v} (${formatBytes(v)})`));
  L.push(`  embedding ${formatBytes(r.embed_bytes)}, head ${formatBytes(r.head_bytes)}${r.global_bytes ? `, every stage ${formatBytes(r.global_bytes)}` : ''}` +
    `${r.mtp_bytes ? `, MTP blocks ${formatBytes(r.mtp_bytes)} (optional, not planned)` : ''}`);
  if (r.largest_tensor) L.push(`  largest tensor ${r.largest_tensor.name} ${formatBytes(r.largest_tensor.bytes)}`);
  if (r.expert_bytes) L.push(`  routed experts ${formatBytes(r.expert_bytes)} of the blocks; a decoded token reads ${formatBytes(r.active_weight_bytes_per_token)} of weights`);
  L.push('', `KV cache (f16): ${r.kv_bytes_per_token} B/token for the whole model`);
  L.push(...byValue(r.kv_bytes_per_token_per_layer, (v) => `${v} B/token`));
  if (r.fixed_state_bytes) L.push(`  fixed per session: ${formatBytes(r.fixed_state_bytes)}`);
  L.push(`activations per hop: ${r.hop_bytes_per_token} B/token (f16${r.hc_streams > 1 ? ` × ${r.hc_streams} streams` : ''})`);
  if (r.boundaries.notes.length) {
    L.push('', 'boundaries');
    for (const n of r.boundaries.notes) L.push(`  ${n}`);
    if (r.boundaries.free_starts) L.push(`  stages start freely at: ${r.boundaries.free_starts.join(', ')}`);
  }

  const p = r.plan;
  if (!p) {
    L.push('', 'plan: give --peers 16GiB,16GiB,… or --peer-memory 16GiB --peer-count N to plan shards');
    return L.join('\n');
  }
  L.push('', `plan (context ${p.context} tokens, ${Math.round(p.budget_fraction * 100)}% of each peer's memory, browser binding limit ${formatBytes(p.max_binding_bytes)})`);
  if (!p.feasible) {
    L.push(`  NO PLAN: ${p.reason}`);
    return L.join('\n');
  }
  // blockers every stage shares are printed once
  const common = p.stages.length ? p.stages[0]!.blockers.filter((b) => p.stages.every((s) => s.blockers.includes(b))) : [];
  for (const s of p.stages) {
    const what = [s.holds_embedding ? 'embedding' : '', s.holds_head ? 'head' : ''].filter(Boolean).join(' + ');
    L.push(`  peer ${s.peer} ${s.kind} ${formatBytes(s.memory)}: ${s.end - s.start === 1 ? `block ${s.start}` : `blocks ${s.start}-${s.end - 1}`}${what ? ` + ${what}` : ''}` +
      ` — ${formatBytes(s.total_bytes)} of ${formatBytes(s.budget_bytes)} (${(s.fill * 100).toFixed(0)}%)` +
      `${s.inbound_bytes_per_token ? `, receives ${s.inbound_bytes_per_token} B/token` : ''}`);
    if (s.split_tensors.length) {
      const big = s.split_tensors.reduce((a, b) => (b.bytes > a.bytes ? b : a));
      L.push(`      ${s.split_tensors.length} tensor(s) over the binding limit, split by rows (largest ${big.name} ${formatBytes(big.bytes)} → ${big.pieces} bindings)`);
    }
    for (const b of s.blockers) if (!common.includes(b)) L.push(`      blocked: ${b}`);
  }
  for (const b of common) L.push(`  every stage blocked: ${b}`);
  if (p.unused_peers.length) L.push(`  unused peers: ${p.unused_peers.join(', ')}`);
  if (p.fewest_stages && p.fewest_stages.stages < p.stages.length) {
    const ranges = p.fewest_stages.ranges.map((x) => `peer ${x.peer}: ${x.start}-${x.end - 1}`).join(', ');
    L.push(`  fewest stages that fit: ${p.fewest_stages.stages} (${ranges})`);
  }
  L.push(`  wire per decoded token: ${p.wire_bytes_per_token} B over ${Math.max(0, p.stages.length - 1)} hops; runnable now: ${yes(p.runnable_now)}`);
  return L.join('\n');
}
