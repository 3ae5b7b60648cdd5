// `gguf-mesh inspect` as a user runs it: the real binary, on stories260K, on crafted broken
// copies of it, and on a URL served by a real local HTTP server.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli } from './support/cli.ts';
import { stories260K } from './support/models.ts';
import { startRangeServer } from './support/range-server.ts';
import type { RangeServer } from './support/range-server.ts';

const EXPECTED_KEYS = [
  'architecture', 'n_layer', 'n_embd', 'n_head', 'n_head_kv', 'n_ff', 'n_vocab', 'n_ctx_train',
  'tensor_count', 'file_bytes', 'tensor_types', 'layer_bytes',
];

let model: string;
let original: Uint8Array;
let dir: string;
let server: RangeServer;
let plain: RangeServer;

beforeAll(async () => {
  model = await stories260K();
  original = new Uint8Array(readFileSync(model));
  dir = mkdtempSync(join(tmpdir(), 'gguf-inspect-'));
  server = await startRangeServer();
  plain = await startRangeServer({ ignoreRange: true });
  server.set('/stories260K.gguf', original);
  plain.set('/stories260K.gguf', original);
});
afterAll(async () => {
  await server?.close();
  await plain?.close();
  rmSync(dir, { recursive: true, force: true });
});

function variant(name: string, bytes: Uint8Array): string {
  const p = join(dir, name);
  writeFileSync(p, bytes);
  return p;
}

/** offset of the u32 type field of the tensor info of `name` (located by its name bytes) */
function typeFieldOffset(bytes: Uint8Array, name: string): number {
  const needle = new TextEncoder().encode(name);
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  for (let i = 8; i < bytes.length - needle.length; i++) {
    if (!needle.every((c, j) => bytes[i + j] === c)) continue;
    if (Number(view.getBigUint64(i - 8, true)) !== needle.length) continue; // a tensor name's length prefix
    const nDims = view.getUint32(i + needle.length, true);
    if (nDims < 1 || nDims > 4) continue;
    return i + needle.length + 4 + 8 * nDims;
  }
  throw new Error(`tensor info for ${name} not found`);
}

describe('gguf-mesh inspect', () => {
  it('--json reports stories260K exactly, with exactly the specified keys', async () => {
    const r = await runCli(['inspect', model, '--json']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const j = JSON.parse(r.stdout) as Record<string, unknown>;
    expect(Object.keys(j)).toEqual(EXPECTED_KEYS);
    expect(j).toEqual({
      architecture: 'llama',
      n_layer: 5,
      n_embd: 64,
      n_head: 8,
      n_head_kv: 4,
      n_ff: 172,
      n_vocab: 512,
      n_ctx_train: 2048,
      tensor_count: 48,
      file_bytes: original.length,
      tensor_types: { F32: 48 },
      // per layer: q 64×64, k 64×32, v 64×32, o 64×64, gate/up 64×172, down 172×64, 2 norms of 64; f32
      layer_bytes: Array(5).fill((64 * 64 * 2 + 64 * 32 * 2 + 64 * 172 * 3 + 64 * 2) * 4),
    });
  });

  it('text output shows the shape and the rope settings', async () => {
    const r = await runCli(['inspect', model]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/architecture\s+llama/);
    expect(r.stdout).toMatch(/n_layer\s+5/);
    expect(r.stdout).toMatch(/n_head_kv\s+4/);
    expect(r.stdout).toMatch(/rope\s+dims 8, freq_base 10000, scaling none/);
    expect(r.stdout).toMatch(/tensor_types\s+F32 ×48/);
    expect(r.stdout).toContain('181760');
  });

  it('reads a URL with Range requests and reports the same', async () => {
    const url = `${server.url}/stories260K.gguf`;
    const before = server.requests.length;
    const [remote, local] = await Promise.all([runCli(['inspect', url, '--json']), runCli(['inspect', model, '--json'])]);
    expect(remote.code, remote.stderr).toBe(0);
    expect(JSON.parse(remote.stdout)).toEqual(JSON.parse(local.stdout));
    const seen = server.requests.slice(before);
    expect(seen.length).toBeGreaterThan(0);
    expect(seen.every((q) => q.range !== undefined)).toBe(true);
  });

  const errorCases: [string, () => string | Promise<string>, string][] = [
    ['not a GGUF', () => variant('text.gguf', new TextEncoder().encode('just some text, not a model file at all')), 'GGUF_NOT_GGUF'],
    ['an unsupported version', () => {
      const b = original.slice();
      new DataView(b.buffer).setUint32(4, 1, true);
      return variant('v1.gguf', b);
    }, 'GGUF_BAD_VERSION'],
    ['a truncated header', () => variant('cut.gguf', original.slice(0, 4000)), 'GGUF_TRUNCATED_HEADER'],
    ['tensor data past the end', () => variant('short.gguf', original.slice(0, original.length - 64)), 'GGUF_DATA_PAST_EOF'],
    ['an unknown tensor type', () => {
      const b = original.slice();
      new DataView(b.buffer).setUint32(typeFieldOffset(b, 'blk.1.attn_k.weight'), 250, true);
      return variant('unknown.gguf', b);
    }, 'GGUF_UNKNOWN_TYPE'],
    ['a server that ignores Range', () => `${plain.url}/stories260K.gguf`, 'RANGE_NOT_SUPPORTED'],
    ['a missing file', () => join(dir, 'does-not-exist.gguf'), 'GGUF_NOT_FOUND'],
  ];
  for (const [what, make, code] of errorCases) {
    it(`exits 1 naming ${what} (${code})`, async () => {
      const r = await runCli(['inspect', await make(), '--json']);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe('');
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(code);
    });
  }

  it('names the tensor with the unknown type and the tensor past the end', async () => {
    const b = original.slice();
    new DataView(b.buffer).setUint32(typeFieldOffset(b, 'blk.1.attn_k.weight'), 250, true);
    const r = await runCli(['inspect', variant('unknown2.gguf', b)]);
    expect(r.stderr).toContain("'blk.1.attn_k.weight'");
    expect(r.stderr).toContain('250');
    const r2 = await runCli(['inspect', variant('short2.gguf', original.slice(0, original.length - 64))]);
    expect(r2.stderr).toContain("'blk.4.ffn_norm.weight'");
  });

  it('usage errors exit 2', async () => {
    expect((await runCli(['inspect'])).code).toBe(2);
    expect((await runCli(['inspect', model, '--bogus'])).code).toBe(2);
  });
});
