// HTTPS for `serve` without a network: which TLS a bind gets, the local CA and its leaf as
// verifiers read them (name constraints enforced by a real OpenSSL handshake, not by reading the
// fields back), the cache under the cache dir, an operator's certificate, the native side's
// fingerprint pinning, and coturn's REST-API credentials.
import { createHmac, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:https';
import type { Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { caPermits, certFacts, certFingerprint, issueServerCert, LEAF_DAYS, makeLocalCa, permittedNames } from '../signaling-server/local-ca.ts';
import { chooseTls, localCaTls, machineNames, operatorTls, serveTrustFiles } from '../signaling-server/tls.ts';
import { iceServersMinting, mintTurnCredential } from '../signaling-server/turn.ts';
import { parseIceServer } from '../src/protocol/control.ts';
import { parseFingerprint, pinServerCa, trustRoomServer } from '../src/transport/tls-trust.ts';
import { runCli } from './support/cli.ts';

const dirs: string[] = [];
const servers: Server[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'gguf-mesh-tls-'));
  dirs.push(d);
  return d;
};
afterAll(async () => {
  for (const s of servers) await new Promise((r) => s.close(r));
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** An HTTPS server on loopback presenting `cert` (a chain) and `key`. */
async function httpsOn(cert: string, key: string): Promise<string> {
  const s = createServer({ cert, key }, (_req, res) => serveTrustFiles(null, _req, res) || res.writeHead(200).end('ok'));
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return `https://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

/** A verified handshake against `ca` alone: resolves true, or with OpenSSL's reason. */
function handshake(base: string, ca: string): Promise<true | string> {
  const u = new URL(base);
  return new Promise((resolve) => {
    const s = connect({ host: u.hostname, port: Number(u.port), ca, rejectUnauthorized: true });
    s.once('secureConnect', () => (s.destroy(), resolve(true)));
    s.once('error', (e) => resolve(e.message));
  });
}

describe('which TLS a bind gets', () => {
  it('loopback stays plain HTTP, any other address gets the local CA, --insecure-http or an operator\'s files override', () => {
    expect(chooseTls({ host: '127.0.0.1' })).toEqual({ kind: 'off' });
    expect(chooseTls({ host: '::1' })).toEqual({ kind: 'off' });
    expect(chooseTls({ host: '127.0.0.1', force: true })).toEqual({ kind: 'local-ca' });
    expect(chooseTls({ host: '0.0.0.0' })).toEqual({ kind: 'local-ca' });
    expect(chooseTls({ host: '192.168.1.20' })).toEqual({ kind: 'local-ca' });
    expect(chooseTls({ host: '0.0.0.0', insecureHttp: true })).toEqual({ kind: 'off' });
    expect(chooseTls({ host: '0.0.0.0', certFile: 'c.pem', keyFile: 'k.pem' })).toEqual({ kind: 'operator', certFile: 'c.pem', keyFile: 'k.pem' });
    expect(() => chooseTls({ host: '0.0.0.0', certFile: 'c.pem' })).toThrow(expect.objectContaining({ code: 'TLS_BAD_OPTIONS' }));
    expect(() => chooseTls({ host: '0.0.0.0', force: true, insecureHttp: true })).toThrow(expect.objectContaining({ code: 'TLS_BAD_OPTIONS' }));
  });

  it('the machine\'s names cover its interface addresses, the bound address, localhost and .local', () => {
    const n = machineNames('203.0.113.7');
    expect(n.leaf.ips).toContain('127.0.0.1');
    expect(n.leaf.ips).toContain('203.0.113.7');
    expect(n.leaf.dns).toContain('localhost');
    expect(n.ca.dns).toEqual(expect.arrayContaining(['localhost', 'local']));
    expect(machineNames('0.0.0.0').leaf.ips).not.toContain('0.0.0.0');
  });
});

describe('the local CA and its leaf', () => {
  const names = { ips: ['127.0.0.1', '10.9.0.1'], dns: ['localhost', 'local'] };

  it('a CA constrained to the names (pathLen 0, keyCertSign) and a leaf phones accept (IP SANs, serverAuth, ≤ 825 days)', async () => {
    const ca = await makeLocalCa(names, 'test CA');
    const leaf = await issueServerCert(ca, { ips: ['127.0.0.1', '10.9.0.1'], dns: ['localhost', 'box.local'] });
    const c = new X509Certificate(ca.cert);
    expect(c.ca).toBe(true);
    expect(permittedNames(ca.cert)).toEqual({ ips: ['127.0.0.1/32', '10.9.0.1/32'], dns: ['localhost', 'local'] });
    const l = new X509Certificate(leaf.cert);
    expect(l.ca).toBe(false);
    expect(l.keyUsage).toEqual(['1.3.6.1.5.5.7.3.1']); // Node lists the extended key usages: serverAuth only
    expect(l.checkIP('10.9.0.1')).toBe('10.9.0.1');
    expect(l.checkHost('box.local')).toBe('box.local');
    expect(l.verify(c.publicKey)).toBe(true);
    const f = certFacts(leaf.cert);
    const days = (f.notAfter.getTime() - f.notBefore.getTime()) / 86_400_000;
    expect(days).toBeLessThanOrEqual(825);
    expect(days).toBe(LEAF_DAYS + 1); // a day of slack before now for clocks that run behind
    expect(caPermits(ca.cert, { ips: ['10.9.0.1'], dns: ['x.local'] })).toBe(true);
    expect(caPermits(ca.cert, { ips: ['10.9.0.2'], dns: [] })).toBe(false);
  });

  it('OpenSSL accepts the leaf over TLS, and refuses one the CA signed for an address outside its constraints', async () => {
    const ca = await makeLocalCa(names, 'test CA');
    const good = await issueServerCert(ca, { ips: ['127.0.0.1'], dns: ['localhost'] });
    expect(await handshake(await httpsOn(good.cert + ca.cert, good.key), ca.cert)).toBe(true);
    // the same CA's key signs a leaf naming 127.0.0.2 too: a verifier must reject it
    const outside = await issueServerCert(ca, { ips: ['127.0.0.1', '127.0.0.2'], dns: [] });
    expect(await handshake(await httpsOn(outside.cert + ca.cert, outside.key), ca.cert)).toMatch(/permitted subtree violation/);
  });

  it('is cached under the cache dir with owner-only keys, reused, and re-made when the names leave the CA\'s constraints', async () => {
    const dir = join(tmp(), 'tls');
    const lines: string[] = [];
    const first = await localCaTls(dir, { leaf: names, ca: names }, (l) => lines.push(l));
    expect(lines.map((l) => l.split(' ')[0])).toEqual(['made', 'issued']);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    for (const f of ['ca-key.pem', 'server-key.pem']) expect(statSync(join(dir, f)).mode & 0o777).toBe(0o600);
    expect(first.ca!.fingerprint).toBe(certFingerprint(readFileSync(join(dir, 'ca.pem'), 'utf8')));
    lines.length = 0;
    const again = await localCaTls(dir, { leaf: names, ca: names }, (l) => lines.push(l));
    expect(lines).toEqual([]);
    expect(again.ca!.fingerprint).toBe(first.ca!.fingerprint);
    expect(again.cert).toBe(first.cert);
    // a new leaf name inside the constraints: same CA, a new leaf
    const more = await localCaTls(dir, { leaf: { ...names, dns: ['localhost', 'box.local'] }, ca: names }, (l) => lines.push(l));
    expect(more.ca!.fingerprint).toBe(first.ca!.fingerprint);
    expect(lines.map((l) => l.split(' ')[0])).toEqual(['issued']);
    // a new address: the CA cannot sign for it, so a new CA (devices trust it again)
    const moved = await localCaTls(dir, { leaf: { ips: ['10.9.0.5'], dns: [] }, ca: { ips: ['10.9.0.5'], dns: ['local'] } });
    expect(moved.ca!.fingerprint).not.toBe(first.ca!.fingerprint);
  });

  it('an operator\'s certificate loads when it matches its key, and is refused naming the files when not', async () => {
    const d = tmp();
    const ca = await makeLocalCa(names, 'operator CA');
    const a = await issueServerCert(ca, names);
    const b = await issueServerCert(ca, names);
    writeFileSync(join(d, 'a.pem'), a.cert);
    writeFileSync(join(d, 'a-key.pem'), a.key);
    writeFileSync(join(d, 'b-key.pem'), b.key);
    expect((await operatorTls(join(d, 'a.pem'), join(d, 'a-key.pem'))).ca).toBeNull();
    await expect(operatorTls(join(d, 'a.pem'), join(d, 'b-key.pem'))).rejects.toMatchObject({ code: 'TLS_BAD_CERT', message: expect.stringContaining('b-key.pem') });
    await expect(operatorTls(join(d, 'missing.pem'), join(d, 'a-key.pem'))).rejects.toMatchObject({ code: 'TLS_BAD_CERT' });
  });
});

describe('a native process trusts a local CA by its fingerprint', () => {
  it('pins the CA the server presents, refuses another fingerprint, and parses the forms people paste', async () => {
    const ca = await makeLocalCa({ ips: ['127.0.0.1'], dns: ['localhost'] }, 'pinned CA');
    const leaf = await issueServerCert(ca, { ips: ['127.0.0.1'], dns: ['localhost'] });
    const base = await httpsOn(leaf.cert + ca.cert, leaf.key);
    const fp = certFingerprint(ca.cert);
    await expect(fetch(`${base}/`)).rejects.toThrow(); // not trusted before pinning
    await expect(pinServerCa(base, 'ab'.repeat(32))).rejects.toMatchObject({ code: 'TLS_FINGERPRINT_MISMATCH', message: expect.stringContaining(fp) });
    await trustRoomServer(`${base}/room/r1#secret=s&ca=${fp}`);
    expect(await (await fetch(`${base}/`)).text()).toBe('ok'); // fetch verifies against the pinned CA now
    const display = fp.toUpperCase().match(/../g)!.join(':');
    expect(parseFingerprint(display)).toBe(fp);
    expect(parseFingerprint(`sha256:${fp}`)).toBe(fp);
    expect(() => parseFingerprint('12:34')).toThrow(expect.objectContaining({ code: 'BAD_CA_FINGERPRINT' }));
  });
});

describe('TURN credentials (coturn REST-API scheme)', () => {
  it('mints <expiry>:<name> with base64 HMAC-SHA1 of the shared secret, for TURN servers that name no credential', () => {
    const c = mintTurnCredential('s3cret', 'tab-1a', 600, 1_700_000_000_000);
    expect(c.username).toBe('1700000600:tab-1a');
    expect(c.credential).toBe(createHmac('sha1', 's3cret').update('1700000600:tab-1a').digest('base64'));
    const servers = iceServersMinting([parseIceServer('turn:10.0.0.1:3478', { minted: true }), parseIceServer('stun:10.0.0.1:3478'), parseIceServer('turn:u:p@10.0.0.2')], 's3cret', 600)('peer-7');
    expect(servers[0]).toMatchObject({ urls: 'turn:10.0.0.1:3478', username: expect.stringMatching(/^\d+:peer-7$/) });
    expect(servers[1]).toEqual({ urls: 'stun:10.0.0.1:3478' });
    expect(servers[2]).toEqual({ urls: 'turn:10.0.0.2', username: 'u', credential: 'p' });
    expect(() => parseIceServer('turn:10.0.0.1')).toThrow(expect.objectContaining({ code: 'BAD_ICE_SERVER' }));
    expect(() => parseIceServer('turn:u:p@10.0.0.1', { minted: true })).toThrow(expect.objectContaining({ code: 'BAD_ICE_SERVER' }));
  });
});

describe('serve --tls on loopback', () => {
  it('serves HTTPS with the local CA and offers the CA certificate and its fingerprint without the secret', async () => {
    const cache = tmp();
    const { spawnMesh, killAll } = await import('./support/mesh.ts');
    const model = (await import('./support/models.ts')).stories260K;
    const proc = spawnMesh(['serve', '--tls', '--port', '0', '--ui', 'off', '--model', await model()], { env: { GGUF_MESH_CACHE: cache } });
    try {
      const [, join_] = await proc.waitFor(/join:\s+(\S+)/);
      const base = new URL(join_!).origin;
      expect(base).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
      await trustRoomServer(join_!);
      const info = (await (await fetch(`${base}/tls/ca.json`)).json()) as { fingerprint: string; crt: string };
      expect(new URL(join_!).hash).toContain(`ca=${info.fingerprint}`);
      const der = new Uint8Array(await (await fetch(`${base}${info.crt}`)).arrayBuffer());
      expect(new X509Certificate(der).fingerprint256.replace(/:/g, '').toLowerCase()).toBe(info.fingerprint);
      expect(proc.output()).toMatch(/trust: +https:\/\/127\.0\.0\.1:\d+\/tls\/ca\.crt/);
    } finally {
      await killAll();
    }
  });

  it('refuses half an operator certificate as a usage error', async () => {
    const r = await runCli(['serve', '--tls-cert', 'x.pem', '--ui', 'off']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--tls-cert and --tls-key go together/);
  });
});
