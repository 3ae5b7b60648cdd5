// The node hands its options to the PyTorch peer on a command line (src/peer/torch-process.ts
// torchPeerArgs); the peer's own argparse parser must read back every value as given. A room
// secret is base64url and may start with '-', which argparse takes for a flag when the value
// is a separate word: the case that failed a CI run.
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { findTorchPython, TORCH_PEER_DIR, torchPeerArgs } from '../src/peer/torch-process.ts';

/** What the peer's parser makes of these arguments (its namespace as JSON). */
function parsedByPeer(args: string[]): Record<string, unknown> {
  const script = 'import json, sys\nfrom gguf_mesh_torch.__main__ import build_parser\nprint(json.dumps(vars(build_parser().parse_args(sys.argv[1:]))))';
  const out = execFileSync(findTorchPython().python, ['-c', script, ...args], { cwd: TORCH_PEER_DIR, encoding: 'utf8' });
  return JSON.parse(out) as Record<string, unknown>;
}

describe('the PyTorch peer reads the options the node passes', () => {
  it('keeps a secret, a name and paths that start with a dash', () => {
    const args = torchPeerArgs({
      joinUrl: 'ws://127.0.0.1:8080/join?room=r',
      secret: '-Xk9_-a',
      memoryBytes: 1 << 30,
      layers: { start: 2, end: 5 },
      name: '--odd name',
      advertise: '10.0.0.2:9000',
      cacheDir: '-cache dir',
      carrier: 'http',
      device: 'cpu',
      threads: 3,
    });
    expect(args.slice(0, 2)).toEqual(['-m', 'gguf_mesh_torch']);
    const ns = parsedByPeer(args.slice(2));
    expect(ns).toMatchObject({
      cmd: 'join',
      join: 'ws://127.0.0.1:8080/join?room=r',
      secret: '-Xk9_-a',
      memory: String(1 << 30),
      layers: '2-5',
      name: '--odd name',
      advertise: '10.0.0.2:9000',
      cache_dir: '-cache dir',
      carrier: 'http',
      device: 'cpu',
      threads: 3,
      no_cache: false,
    });
  });
});

describe('fresh secrets', () => {
  it('never start with a dash, so `--secret <value>` reads them on any command line', async () => {
    const { newSecret } = await import('../signaling-server/room-identity.ts');
    const seen = new Set<string>();
    for (let i = 0; i < 2000; i++) {
      const s = newSecret();
      expect(s).toMatch(/^[A-Za-z0-9_][A-Za-z0-9_-]{23}$/);
      seen.add(s);
    }
    expect(seen.size).toBe(2000);
  });
});
