// `gguf-mesh audit` through the real binary: a 149 GiB DeepSeek-V4-Flash–shaped file behind a
// local HTTP server with Range support (only its header bytes may be fetched), text and JSON
// output, the documented JSON keys, and usage errors.

import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GgmlType } from '../src/gguf/types.ts';
import { planGguf, writeGguf } from '../src/gguf/writer.ts';
import type { AuditReport } from '../src/audit/report.ts';
import { deepseek4Spec, qwen35moeSpec } from './audit-fixtures.ts';
import { runCli } from './support/cli.ts';
import { stories260K } from './support/models.ts';

const GiB = 1024 ** 3;

/**
 * Serves one virtual file: the real header bytes, then zeros up to the size the full model would
 * have. Counts every byte it sends and the start of every range asked for.
 */
interface VirtualFileServer {
  url: string;
  bytesServed: number;
  rangeStarts: number[];
  close(): Promise<void>;
}

async function serveVirtualFile(path: string, header: Uint8Array, totalBytes: number): Promise<VirtualFileServer> {
  const state = { bytesServed: 0, rangeStarts: [] as number[] };
  const server: Server = createServer((req, res) => {
    if (req.url !== path) {
      res.writeHead(404).end();
      return;
    }
    if (req.method === 'HEAD') {
      res.writeHead(200, { 'content-length': totalBytes, 'accept-ranges': 'bytes' }).end();
      return;
    }
    const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    if (!m) {
      // a full GET of a 149 GiB file: refuse loudly rather than stream it
      res.writeHead(400).end('this test server only answers Range requests');
      return;
    }
    const start = Number(m[1]);
    const end = Math.min(m[2] ? Number(m[2]) : totalBytes - 1, totalBytes - 1);
    state.rangeStarts.push(start);
    if (start >= totalBytes) {
      res.writeHead(416, { 'content-range': `bytes */${totalBytes}` }).end();
      return;
    }
    const body = new Uint8Array(end - start + 1); // zeros past the header
    if (start < header.length) body.set(header.subarray(start, Math.min(header.length, end + 1)), 0);
    state.bytesServed += body.length;
    res.writeHead(206, { 'content-range': `bytes ${start}-${end}/${totalBytes}`, 'content-length': body.length });
    res.end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}${path}`,
    get bytesServed() {
      return state.bytesServed;
    },
    get rangeStarts() {
      return state.rangeStarts;
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((e) => (e ? reject(e) : resolve()));
      }),
  };
}

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'audit-cli-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('gguf-mesh audit over HTTP', () => {
  it('audits a 149 GiB remote file by fetching only its header', async () => {
    const spec = deepseek4Spec({ matrix: GgmlType.Q4_K, experts: GgmlType.Q4_K });
    const header = writeGguf(spec);
    const total = planGguf({ ...spec, headerOnly: false }).fileBytes;
    expect(total).toBeGreaterThan(140 * GiB);
    const server = await serveVirtualFile('/DeepSeek-V4-Flash-Q4_K.gguf', header, total);
    try {
      const res = await runCli(['audit', server.url, '--json', '--peers', 'native:64GiB,24GiB,24GiB,24GiB,24GiB,native:64GiB']);
      expect(res.stderr).toBe('');
      expect(res.code).toBe(0);
      const r = JSON.parse(res.stdout) as AuditReport;
      expect(r.file_bytes).toBe(total);
      expect(r.architecture).toBe('deepseek4');
      expect(r.layer_bytes[2]).toBe(3_720_367_064);
      expect(r.plan!.feasible).toBe(true);
      expect(r.plan!.stages).toHaveLength(6);
      // only header bytes: every range starts inside the header, and what was sent is at most
      // the header rounded up to @huggingface/gguf's 2 MB read window
      expect(server.rangeStarts.length).toBeGreaterThan(0);
      expect(server.rangeStarts.every((s) => s < header.length)).toBe(true);
      expect(server.bytesServed).toBeGreaterThanOrEqual(header.length);
      expect(server.bytesServed).toBeLessThanOrEqual(Math.ceil(header.length / 2e6) * 2e6);
      expect(server.bytesServed / total).toBeLessThan(1e-4);
    } finally {
      await server.close();
    }
  });
});

describe('gguf-mesh audit output', () => {
  it('prints a text report with backends, blocks, KV, hop bytes and a plan for stories260K', async () => {
    const res = await runCli(['audit', await stories260K(), '--peers', '8MiB,native:8MiB']);
    expect(res.code).toBe(0);
    expect(res.stdout).toMatch(/architecture llama, 5 blocks/);
    expect(res.stdout).toMatch(/cpu\s+READY/);
    expect(res.stdout).toMatch(/webgpu\s+READY/);
    expect(res.stdout).toMatch(/KV cache \(f16\): 640 B\/token/);
    expect(res.stdout).toMatch(/activations per hop: 128 B\/token/);
    expect(res.stdout).toMatch(/peer 0 browser 8\.00 MiB: blocks 0-\d \+ embedding/);
    expect(res.stdout).toMatch(/peer 1 native 8\.00 MiB: blocks? \d.* \+ head/);
    expect(res.stdout).toMatch(/runnable now: yes/);
  });

  it('explains why no plan fits', async () => {
    const path = join(dir, 'qwen.gguf');
    writeFileSync(path, writeGguf(qwen35moeSpec({ matrix: GgmlType.Q4_K, experts: GgmlType.Q4_K })));
    const res = await runCli(['audit', path, '--peer-memory', '24GiB', '--peer-count', '1']);
    expect(res.code).toBe(0);
    expect(res.stdout).toMatch(/NO PLAN: .*needs 18\.\d+ GiB/);
    expect(res.stdout).toMatch(/gated_deltanet/);
  });

  it('documents every JSON key it prints in --help', async () => {
    const help = await runCli(['audit', '--help']);
    expect(help.code).toBe(0);
    const res = await runCli(['audit', await stories260K(), '--json', '--peer-memory', '8MiB', '--peer-count', '2']);
    const r = JSON.parse(res.stdout) as Record<string, unknown>;
    const plan = r.plan as Record<string, unknown>;
    const stage = (plan.stages as Record<string, unknown>[])[0]!;
    for (const key of [...Object.keys(r), ...Object.keys(plan), ...Object.keys(stage)]) {
      expect(help.stdout, `--help should document '${key}'`).toContain(key);
    }
  });

  it('rejects malformed peer options with exit code 2', async () => {
    const model = await stories260K();
    const bad = await runCli(['audit', model, '--peers', '16apples']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/'16apples' is not a peer size/);
    const both = await runCli(['audit', model, '--peers', '8GiB', '--peer-memory', '8GiB', '--peer-count', '2']);
    expect(both.code).toBe(2);
    const count = await runCli(['audit', model, '--peer-count', '2']);
    expect(count.code).toBe(2);
    expect(count.stderr).toMatch(/--peer-count needs --peer-memory/);
  });

  it('fails with the reader\'s error code on a file that is not GGUF', async () => {
    const path = join(dir, 'not.gguf');
    writeFileSync(path, 'hello, this is not a model at all');
    const res = await runCli(['audit', path]);
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(/GGUF_NOT_GGUF/);
  });
});
