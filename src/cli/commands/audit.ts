// `gguf-mesh audit <path|url> [--peers …|--peer-memory S --peer-count N] [--json]`: can
// gguf-mesh serve this model, and how would it be cut? Reads only the GGUF header (a URL
// costs a few Range requests, whatever the file size) and reports backend support, bytes per
// block, KV and hop bytes per token, and a shard plan for the given peers.

import type { Command, ParsedArgs } from '../command.ts';
import { UsageError, intOption, numberOption, stringOption } from '../command.ts';
import { readHeader } from '../../gguf/parse.ts';
import { auditHeader } from '../../audit/report.ts';
import { formatAudit } from '../../audit/format.ts';
import { DEFAULT_PLAN_OPTIONS } from '../../audit/plan.ts';
import type { PeerKind, PeerSpec } from '../../audit/plan.ts';
import { parseByteSize } from '../../units.ts';

/** "16GiB", "native:64GiB", "browser:8GB" → a peer. */
function parsePeer(text: string, option: string): PeerSpec {
  const m = /^(?:(browser|native):)?(.+)$/i.exec(text.trim());
  const memory = m ? parseByteSize(m[2]!) : undefined;
  if (!m || memory === undefined) {
    throw new UsageError(`--${option}: '${text}' is not a peer size (e.g. 16GiB, native:64GiB, browser:8GB)`);
  }
  return { kind: ((m[1] ?? 'browser').toLowerCase() as PeerKind), memory };
}

function peersFrom(args: ParsedArgs): PeerSpec[] | undefined {
  const list = stringOption(args, 'peers');
  const each = stringOption(args, 'peer-memory');
  const count = args.values['peer-count'];
  if (list !== undefined && (each !== undefined || count !== undefined)) {
    throw new UsageError('give either --peers or --peer-memory with --peer-count, not both');
  }
  if (list !== undefined) return list.split(',').filter((s) => s.trim()).map((s) => parsePeer(s, 'peers'));
  if (each === undefined && count === undefined) return undefined;
  if (each === undefined) throw new UsageError('--peer-count needs --peer-memory');
  const n = intOption(args, 'peer-count', 1);
  if (n < 1 || n > 1000) throw new UsageError(`--peer-count must be between 1 and 1000, got ${n}`);
  const peer = parsePeer(each, 'peer-memory');
  return Array.from({ length: n }, () => ({ ...peer }));
}

const JSON_KEYS = `JSON output (--json), one object:
  location, architecture, serve {accepted, code, reason} (whether serve takes the model;
  every backend's ready needs it), n_layer (main blocks), n_layer_nextn (MTP blocks), n_embd,
  hc_streams, tensor_count, file_bytes;
  backends.{cpu,webgpu,llamacpp}: {architecture, missing_ops[], unsupported_types[], ready, notes[]};
  tensor_types[]: {type, tensors, bytes, cpu, webgpu, llamacpp};
  ops[]: {op, what, cpu, webgpu};
  layer_bytes[], embed_bytes, head_bytes, mtp_bytes (optional MTP blocks, not planned),
  global_bytes, largest_tensor {name, bytes}; expert_bytes (routed experts, all blocks),
  active_weight_bytes_per_token (what one decoded token reads: non-expert weights, the routed
  experts' share, the head);
  kv_bytes_per_token (f16, whole model), kv_bytes_per_token_per_layer[], fixed_state_bytes;
  hop_bytes_per_token (f16 activations crossing one boundary);
  boundaries: {free_starts[] | null, token_id_blocks[], start_penalty_bytes_per_token, notes[]};
  plan (null without peers): {feasible, reason, context, budget_fraction, max_binding_bytes,
    relaxed_starts, unused_peers[], wire_bytes_per_token, runnable_now,
    fewest_stages {stages, ranges[] {peer, start, end}} | null, stages[]: {peer, kind,
    memory, start, end, holds_embedding, holds_head, weight_bytes, kv_bytes, state_bytes,
    total_bytes, budget_bytes, fill, inbound_bytes_per_token, needs_token_ids,
    needs_start_penalty, split_tensors[] {name, bytes, pieces}, backend, blockers[]}}`;

export const command: Command = {
  name: 'audit',
  summary:
    'can gguf-mesh serve this GGUF (file or URL, header only), what it costs per block/token/hop, and a shard plan for given peers',
  usage: `<path|url> [--peers 8GiB,16GiB,…|--peer-memory 16GiB --peer-count N] [--context N] [--max-binding 128MiB] [--json]\n\n${JSON_KEYS}`,
  positionals: [1, 1],
  options: {
    peers: {
      type: 'string',
      valueName: '<sizes>',
      description: 'peers in route order, comma-separated; prefix native: for a native peer (default browser:)',
    },
    'peer-memory': { type: 'string', valueName: '<size>', description: 'memory of each peer (with --peer-count)' },
    'peer-count': { type: 'string', valueName: '<n>', description: 'number of identical peers (with --peer-memory)' },
    context: {
      type: 'string',
      valueName: '<tokens>',
      description: 'context every stage\'s KV cache must hold',
      default: String(DEFAULT_PLAN_OPTIONS.context),
    },
    'max-binding': {
      type: 'string',
      valueName: '<size>',
      description: 'largest WebGPU storage binding of a browser peer (bigger tensors are split by rows)',
      default: '128MiB',
    },
    budget: {
      type: 'string',
      valueName: '<fraction>',
      description: 'share of a peer\'s memory a stage may fill',
      default: String(DEFAULT_PLAN_OPTIONS.budgetFraction),
    },
    json: { type: 'boolean', description: 'print one JSON object (keys above) instead of text' },
  },
  async run(args) {
    const location = args.positionals[0]!;
    const peers = peersFrom(args);
    const context = intOption(args, 'context', DEFAULT_PLAN_OPTIONS.context);
    if (context < 1) throw new UsageError(`--context must be at least 1, got ${context}`);
    const budgetFraction = numberOption(args, 'budget', DEFAULT_PLAN_OPTIONS.budgetFraction);
    if (!(budgetFraction > 0 && budgetFraction <= 1)) throw new UsageError(`--budget must be in (0, 1], got ${budgetFraction}`);
    const bindingText = stringOption(args, 'max-binding');
    const maxBindingBytes = bindingText === undefined ? DEFAULT_PLAN_OPTIONS.maxBindingBytes : parseByteSize(bindingText);
    if (maxBindingBytes === undefined) throw new UsageError(`--max-binding: '${bindingText}' is not a size`);

    // the tensor data may be absent (a header-only copy) or remote and huge: read the header only
    const header = await readHeader(location, { allowTruncatedData: true });
    const report = auditHeader(header, location, {
      ...(peers ? { peers } : {}),
      plan: { context, budgetFraction, maxBindingBytes },
    });
    console.log(args.values.json ? JSON.stringify(report) : formatAudit(report));
    return 0;
  },
};
