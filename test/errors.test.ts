// The error-code registry (src/error-codes.ts): docs/errors.md matches it, every code in it is
// raised somewhere, statuses reach HTTP from it, codes from the wire keep unknown codes
// visible, and no plain Error is thrown in the product's sources.

import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { ERROR_CODES, httpStatusFor, isMeshError, MeshError } from '../src/errors.ts';
import { ERROR_AREAS } from '../src/error-codes.ts';
import { ERRORS_DOC_PATH, renderErrorsDoc } from '../scripts/errors-doc.ts';
import { GgmlType, tensorBytes } from '../src/gguf/types.ts';
import { coalesceRanges } from '../src/gguf/ranges.ts';
import { intOption, UsageError } from '../src/cli/command.ts';
import { startFrameServer } from '../src/transport/frame-server.ts';
import { HttpLink } from '../src/transport/http.ts';
import { WsLink } from '../src/transport/ws.ts';
import { makeFrame, FrameType } from '../src/protocol/frame.ts';
import { newSessionId } from '../src/protocol/session.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const PRODUCT_DIRS = ['src', 'signaling-server', 'workers'];

function sourceFiles(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => join(e.parentPath, e.name).slice(ROOT.length));
}

function caught(f: () => unknown): unknown {
  try {
    f();
  } catch (e) {
    return e;
  }
  throw new Error('expected a throw');
}

describe('the error-code registry', () => {
  it('is what docs/errors.md lists, code for code and word for word', () => {
    const doc = readFileSync(ERRORS_DOC_PATH, 'utf8');
    const documented = [...doc.matchAll(/^\| `([A-Z0-9_]+)` \|/gm)].map((m) => m[1]);
    const registered = Object.keys(ERROR_CODES);
    expect(registered.filter((c) => !documented.includes(c)), 'registered but not documented (run npm run docs:errors)').toEqual([]);
    expect(documented.filter((c) => !registered.includes(c)), 'documented but not registered').toEqual([]);
    expect(doc, 'docs/errors.md is stale: run npm run docs:errors').toBe(renderErrorsDoc());
  });

  it('holds each code in exactly one area', () => {
    const all = ERROR_AREAS.flatMap((a) => Object.keys(a.codes));
    expect(all.length).toBe(new Set(all).size);
    expect(new Set(all)).toEqual(new Set(Object.keys(ERROR_CODES)));
  });

  it('holds no stale code: each one is raised somewhere in the product', () => {
    const text = PRODUCT_DIRS.flatMap(sourceFiles)
      .filter((f) => !f.endsWith('error-codes.ts'))
      .map((f) => readFileSync(join(ROOT, f), 'utf8'))
      .join('\n');
    expect(Object.keys(ERROR_CODES).filter((c) => !text.includes(`'${c}'`))).toEqual([]);
  });

  it('gives every wire-format error 400 and a code it does not know 500', () => {
    const wire = Object.keys(ERROR_CODES).filter((c) => c.startsWith('FRAME_') || c.startsWith('FRAGMENT_'));
    expect(wire.length).toBeGreaterThan(20);
    expect(wire.filter((c) => httpStatusFor(c) !== 400)).toEqual([]);
    expect(httpStatusFor('AUTH_FAILED')).toBe(401);
    expect(httpStatusFor('SESSION_UNKNOWN')).toBe(404);
    expect(httpStatusFor('POSITION_MISMATCH')).toBe(409);
    expect(httpStatusFor('STAGE_UNREACHABLE')).toBe(502);
    expect(httpStatusFor('NOT_A_CODE')).toBe(500);
  });
});

describe('MeshError.fromWire', () => {
  it('keeps a registered code and its details', () => {
    const e = MeshError.fromWire('POSITION_MISMATCH', 'at 3, got 5', { expected: 3 });
    expect(e.code).toBe('POSITION_MISMATCH');
    expect(e.message).toBe('at 3, got 5');
    expect(e.details).toEqual({ expected: 3 });
  });

  it('turns an unknown code into REMOTE_ERROR that still names it', () => {
    const e = MeshError.fromWire('FUTURE_CODE', 'something new', { stage: 2 });
    expect(e.code).toBe('REMOTE_ERROR');
    expect(e.message).toBe('FUTURE_CODE: something new');
    expect(e.details).toEqual({ stage: 2, remoteCode: 'FUTURE_CODE' });
    expect(MeshError.fromWire(undefined, 'no code').code).toBe('REMOTE_ERROR');
    expect(MeshError.fromWire(42, 'odd').details).toEqual({ remoteCode: '42' });
  });

  it('reads an unknown code from a real HTTP error body through HttpLink', async () => {
    const server = createServer((_req, res) => {
      res.writeHead(418, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'FUTURE_CODE', message: 'teapot' } }));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const e = await new HttpLink(base).request(makeFrame({ type: FrameType.SessionClose, sessionId: newSessionId() })).catch((x: unknown) => x);
      expect(isMeshError(e, 'REMOTE_ERROR'), String(e)).toBe(true);
      expect((e as MeshError).details?.remoteCode).toBe('FUTURE_CODE');
    } finally {
      await new Promise((r) => server.close(r));
    }
  });
});

describe('statuses reach HTTP from the registry', () => {
  it('answers an unknown path with NOT_FOUND 404 and refuses upgrades with 404 and 401', async () => {
    const fs = await startFrameServer({ host: '127.0.0.1', port: 0, secret: 's3', handler: async (f) => f, status: () => ({}) });
    try {
      const res = await fetch(`${fs.url}/nope`, { headers: { authorization: 'Bearer s3' } });
      expect(res.status).toBe(httpStatusFor('NOT_FOUND'));
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('NOT_FOUND');
      const upgradeStatus = (url: string, secret: string) =>
        new Promise<number>((resolve, reject) => {
          const ws = new WebSocket(url, { headers: { authorization: `Bearer ${secret}` } });
          ws.once('unexpected-response', (_req, r) => resolve(r.statusCode ?? 0));
          ws.once('open', () => reject(new Error('upgrade accepted')));
          ws.once('error', () => undefined);
        });
      expect(await upgradeStatus(`${fs.url.replace('http', 'ws')}/elsewhere`, 's3')).toBe(404);
      expect(await upgradeStatus(fs.wsUrl, 'wrong')).toBe(401);
      const e = await WsLink.connect(`${fs.url.replace('http', 'ws')}/elsewhere`, { headers: { authorization: 'Bearer s3' } }).catch((x: unknown) => x);
      expect(isMeshError(e, 'LINK_FAILED'), String(e)).toBe(true);
    } finally {
      await fs.close();
    }
  });
});

describe('errors that were plain Errors', () => {
  it('tensorBytes names an unknown type and a partial block', () => {
    expect((caught(() => tensorBytes(999 as GgmlType, 32)) as MeshError).code).toBe('GGUF_UNKNOWN_TYPE');
    expect((caught(() => tensorBytes(GgmlType.Q8_0, 33)) as MeshError).code).toBe('BAD_TENSOR_SIZE');
  });

  it('coalesceRanges names a negative range', () => {
    expect((caught(() => coalesceRanges([{ offset: -1, length: 4 }])) as MeshError).code).toBe('BAD_BYTE_RANGE');
  });

  it('a CLI usage error is a MeshError with BAD_USAGE', () => {
    const e = caught(() => intOption({ values: { n: 'x' }, positionals: [] }, 'n', 0));
    expect(e).toBeInstanceOf(UsageError);
    expect(isMeshError(e, 'BAD_USAGE')).toBe(true);
  });
});

/** Places a non-MeshError is constructed on purpose, with why. */
const PLAIN_ERROR_ALLOWED: Record<string, string> = {
  'src/errors.ts': 'MeshError itself extends Error',
  'src/storage/kv-store.ts': "memoryStore raises the browser's own QuotaExceededError so ShardCache's storageError maps it like IndexedDB's",
};

describe('no plain Error escapes the product', () => {
  it('constructs no Error, TypeError, RangeError or DOMException outside the allow-list', () => {
    const plain = /\bnew (Error|TypeError|RangeError|SyntaxError|DOMException)\(|\bthrow (Error|TypeError|RangeError)\(|\bextends (Error|TypeError|RangeError)\b/;
    const hits = PRODUCT_DIRS.flatMap(sourceFiles).flatMap((file) =>
      readFileSync(join(ROOT, file), 'utf8')
        .split('\n')
        .map((line, i) => ({ file, line: i + 1, text: line.trim() }))
        .filter((l) => plain.test(l.text) && !l.text.startsWith('//') && !l.text.startsWith('*')),
    );
    expect(hits.filter((h) => !(h.file in PLAIN_ERROR_ALLOWED))).toEqual([]);
    // the allow-list holds no stale entry
    expect(Object.keys(PLAIN_ERROR_ALLOWED).filter((f) => !hits.some((h) => h.file === f))).toEqual([]);
  });
});
