// `gguf-mesh node --backend torch`: the PyTorch peer (peers/torch/, a separate implementation
// of the protocol in Python) as a child process. Finds a Python that imports torch and numpy —
// $GGUF_MESH_PYTHON, then Debian's /usr/bin/python3 (the first `python3` on PATH may be another
// interpreter, e.g. pyenv's, without them), then `python3` — and runs `python3 -m
// gguf_mesh_torch join …` with this command's options, its output passed through.

import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { MeshError } from '../errors.ts';
import type { ShardRange } from '../backends/types.ts';

/** peers/torch, the folder holding the gguf_mesh_torch package */
export const TORCH_PEER_DIR = fileURLToPath(new URL('../../peers/torch', import.meta.url));

export interface TorchPeerOptions {
  joinUrl: string;
  secret: string;
  memoryBytes: number;
  layers?: ShardRange;
  listen?: string;
  advertise?: string;
  carrier?: 'ws' | 'http';
  name?: string;
  /** null = no cache */
  cacheDir?: string | null;
  device?: 'cpu' | 'cuda';
  threads?: number;
}

const FIND_TORCH = [
  'import importlib.util as u, importlib.metadata as m, sys',
  "missing = [p for p in ('torch', 'numpy') if u.find_spec(p) is None]",
  "sys.exit('No module named ' + ', '.join(missing)) if missing else print(m.version('torch'))",
].join('\n');

/** Pythons to try, in order (an explicit $GGUF_MESH_PYTHON first). */
function candidates(): string[] {
  const env = process.env.GGUF_MESH_PYTHON;
  return [...(env ? [env] : []), '/usr/bin/python3', 'python3'];
}

/** The first Python that imports torch and numpy, with torch's version; TORCH_UNAVAILABLE naming the Debian packages if none does. */
export function findTorchPython(tried: string[] = candidates()): { python: string; torchVersion: string } {
  const failures: string[] = [];
  for (const python of tried) {
    // find_spec, not import: importing torch takes seconds, and the peer imports it anyway
    const r = spawnSync(python, ['-c', FIND_TORCH], { encoding: 'utf8', timeout: 60_000 });
    if (r.status === 0) return { python, torchVersion: r.stdout.trim() };
    failures.push(`${python}: ${r.error ? r.error.message : (r.stderr.trim().split('\n').at(-1) ?? `exit ${r.status}`)}`);
  }
  throw new MeshError(
    'TORCH_UNAVAILABLE',
    `--backend torch needs a Python that imports torch and numpy; none did (${failures.join('; ')}). ` +
      `On Debian: apt-get install python3-torch python3-numpy (or set GGUF_MESH_PYTHON to such an interpreter)`,
  );
}

/** The child's argument list for these options. */
export function torchPeerArgs(o: TorchPeerOptions): string[] {
  // `--flag=value`: argparse reads a separate value that starts with '-' (a base64url secret
  // can) as another flag and refuses it.
  const a = ['-m', 'gguf_mesh_torch', 'join', `--join=${o.joinUrl}`, `--secret=${o.secret}`, `--memory=${o.memoryBytes}`];
  if (o.layers) a.push(`--layers=${o.layers.start}-${o.layers.end}`);
  if (o.listen) a.push(`--listen=${o.listen}`);
  if (o.advertise) a.push(`--advertise=${o.advertise}`);
  if (o.carrier) a.push(`--carrier=${o.carrier}`);
  if (o.name) a.push(`--name=${o.name}`);
  if (o.cacheDir === null) a.push('--no-cache');
  else if (o.cacheDir) a.push(`--cache-dir=${o.cacheDir}`);
  if (o.device) a.push(`--device=${o.device}`);
  if (o.threads) a.push(`--threads=${o.threads}`);
  return a;
}

/** Runs the PyTorch peer until it exits (SIGINT/SIGTERM are passed on); resolves with its exit code. */
export function runTorchPeer(o: TorchPeerOptions, log: (line: string) => void): Promise<number> {
  const { python, torchVersion } = findTorchPython();
  log(`torch peer: ${python} (torch ${torchVersion}), package ${TORCH_PEER_DIR}`);
  const child = spawn(python, torchPeerArgs(o), {
    cwd: TORCH_PEER_DIR,
    env: { ...process.env, GGUF_MESH_PARENT_PID: String(process.pid), PYTHONPATH: [TORCH_PEER_DIR, process.env.PYTHONPATH].filter(Boolean).join(':'), PYTHONUNBUFFERED: '1' },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const pass = (sig: NodeJS.Signals) => (): void => void child.kill(sig);
  const onInt = pass('SIGINT');
  const onTerm = pass('SIGTERM');
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  return new Promise((resolve) => {
    child.on('error', (e) => {
      log(`torch peer: ${e.message}`);
      resolve(1);
    });
    child.on('exit', (code, sig) => {
      process.off('SIGINT', onInt);
      process.off('SIGTERM', onTerm);
      resolve(code ?? (sig ? 128 : 1));
    });
  });
}
