// `gguf-mesh inspect <path|url> [--json]`: what a GGUF holds — architecture, shape, rope,
// tensor types and bytes per layer — read from its header only (a URL costs a few Range
// requests, not a download).

import type { Command } from '../command.ts';
import { readArtifactHeader } from '../../gguf/split.ts';
import { hyperParameters, tensorGroups, tensorTypeHistogram } from '../../gguf/summary.ts';
import type { HyperParameters, PerLayer } from '../../gguf/summary.ts';
import { formatBytes } from '../../units.ts';

/** The header's hyper-parameters (rope is printed in text only), then file facts. */
export interface InspectReport extends Omit<HyperParameters, 'rope'> {
  tensor_count: number;
  file_bytes: number;
  tensor_types: Record<string, number>;
  /** bytes of all blk.N.* tensors, one entry per layer */
  layer_bytes: number[];
}

function show(v: PerLayer): string {
  return Array.isArray(v) ? `[${v.join(', ')}]` : String(v);
}

export const command: Command = {
  name: 'inspect',
  summary: 'show the architecture, shape, tensor types and bytes per layer of a GGUF file or URL',
  usage: '<path|url> [--json]',
  positionals: [1, 1],
  options: {
    json: { type: 'boolean', description: 'print one JSON object instead of text' },
  },
  async run(args) {
    const location = args.positionals[0]!;
    // a split GGUF's parts are one artifact: its block count is checked against all their tensors
    const header = (await readArtifactHeader(location)).header;
    const hp = hyperParameters(header, location);
    const groups = tensorGroups(header, hp.n_layer);
    const { rope: r, ...shape } = hp;
    const report: InspectReport = {
      ...shape,
      tensor_count: header.tensors.length,
      file_bytes: header.fileBytes,
      tensor_types: tensorTypeHistogram(header.tensors),
      layer_bytes: groups.filter((g) => g.name.startsWith('layer.')).map((g) => g.bytes),
    };
    if (args.values.json) {
      console.log(JSON.stringify(report));
      return 0;
    }
    const rope = [
      `dims ${r.dimension_count ?? 'head_dim'}`,
      `freq_base ${r.freq_base}`,
      `scaling ${r.scaling_type}${r.scaling_factor !== null ? ` ×${r.scaling_factor}` : ''}`,
      ...(r.scaling_orig_ctx !== null ? [`orig_ctx ${r.scaling_orig_ctx}`] : []),
    ].join(', ');
    const name = header.metadata['general.name'];
    const byName = new Map(groups.map((g) => [g.name, g]));
    const lines = [
      `${location}${typeof name === 'string' ? `  (${name})` : ''}`,
      `  architecture   ${report.architecture}`,
      `  n_layer        ${report.n_layer}`,
      `  n_embd         ${report.n_embd}`,
      `  n_head         ${show(report.n_head)}`,
      `  n_head_kv      ${show(report.n_head_kv)}`,
      `  n_ff           ${show(report.n_ff)}`,
      `  n_vocab        ${report.n_vocab}`,
      `  n_ctx_train    ${report.n_ctx_train}`,
      `  rope           ${rope}`,
      `  tensor_count   ${report.tensor_count}`,
      `  file_bytes     ${report.file_bytes} (${formatBytes(report.file_bytes, 1)})`,
      `  tensor_types   ${Object.entries(report.tensor_types).map(([t, n]) => `${t} ×${n}`).join(', ')}`,
      `  embed          ${formatBytes(byName.get('embed')!.bytes, 1)}`,
      `  head           ${formatBytes(byName.get('head')!.bytes, 1)}${byName.get('head')!.uses.length ? ' (+ tied token_embd.weight)' : ''}`,
      '  layer_bytes',
      ...report.layer_bytes.map((b, i) => `    ${String(i).padStart(4)}  ${b} (${formatBytes(b, 1)})`),
    ];
    console.log(lines.join('\n'));
    return 0;
  },
};
