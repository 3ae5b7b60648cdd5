// `gguf-mesh manifest <path|url> [--out file] [--json]`: the artifact manifest (sha256 of the
// whole artifact and of every tensor, byte ranges, shard groups), computed by streaming the
// artifact once.

import { writeFile } from 'node:fs/promises';
import type { Command } from '../command.ts';
import { stringOption } from '../command.ts';
import { buildManifest, manifestJson } from '../../gguf/manifest.ts';

export const command: Command = {
  name: 'manifest',
  summary: 'compute the manifest of a GGUF artifact: sha256 of the file and of every tensor, byte ranges, shard groups',
  usage: '<path|url> [--out file] [--json]',
  positionals: [1, 1],
  options: {
    out: { type: 'string', valueName: '<file>', description: 'write the manifest JSON to this file' },
    json: { type: 'boolean', description: 'print the manifest JSON on stdout' },
  },
  async run(args) {
    const location = args.positionals[0]!;
    const out = stringOption(args, 'out');
    const manifest = await buildManifest(location);
    const text = manifestJson(manifest);
    if (out) await writeFile(out, text);
    if (args.values.json) {
      process.stdout.write(text);
      return 0;
    }
    const lines = [
      `artifact  ${manifest.artifact.sha256}`,
      `size      ${manifest.artifact.size} bytes in ${manifest.artifact.files.length} file(s)`,
      `model     ${manifest.architecture}, ${manifest.hyper_parameters.n_layer} layers, ${manifest.tensors.length} tensors, ${manifest.tensor_data_bytes} bytes of tensor data`,
      'groups',
      ...manifest.groups.map(
        (g) => `  ${g.name.padEnd(10)} ${String(g.tensors.length).padStart(4)} tensors ${String(g.bytes).padStart(12)} bytes${g.uses.length ? `  (+ uses ${g.uses.join(', ')})` : ''}`,
      ),
      ...(out ? [`written to ${out}`] : []),
    ];
    console.log(lines.join('\n'));
    return 0;
  },
};
