// HTTPS for `serve`: which certificate it presents, and the trust files it offers.
//
// Browsers give WebGPU, SubtleCrypto and OPFS only to secure contexts, and plain http:// is
// secure only on localhost — so a room served to other devices must be https://. Three ways:
//
//   operator   --tls-cert/--tls-key: a certificate the operator has (a public CA's, a company's)
//   local-ca   a CA made once for this machine (./local-ca.ts), cached under the cache dir's
//              tls/ folder (private keys 0600), and a leaf for the machine's addresses and names;
//              the CA certificate is offered at /tls/ca.crt for devices to trust once
//   off        plain HTTP: on loopback by default; elsewhere only with --insecure-http
//
// A cached CA is reused while its name constraints still cover the machine's names (an address
// that changed needs a new CA, and devices must trust that one); the leaf is re-issued when its
// names change or it is within 30 days of expiry.

import { chmod, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { createSecureContext } from 'node:tls';
import { hostname, networkInterfaces } from 'node:os';
import { isIP } from 'node:net';
import { join } from 'node:path';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { MeshError } from '../src/errors.ts';
import { caPermits, certDer, certFacts, certFingerprint, issueServerCert, makeLocalCa } from './local-ca.ts';
import type { CertNames, KeyedCert } from './local-ca.ts';

export type TlsChoice = { kind: 'off' } | { kind: 'operator'; certFile: string; keyFile: string } | { kind: 'local-ca' };

export interface ServerTls {
  /** PEM chain the server presents (leaf first) */
  cert: string;
  /** PEM private key of the leaf */
  key: string;
  /** the local CA devices trust (absent for an operator's certificate) */
  ca: { pem: string; fingerprint: string } | null;
  /** one line for the console */
  description: string;
}

const RENEW_BEFORE_MS = 30 * 86_400_000;

/** A loopback bind: plain HTTP is a secure context there. */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * What TLS a `serve` gets: an operator's certificate when both files are named; plain HTTP on
 * loopback unless `force` asks for the local CA; elsewhere the local CA unless `insecureHttp`.
 */
export function chooseTls(o: { host: string; certFile?: string | undefined; keyFile?: string | undefined; force?: boolean; insecureHttp?: boolean }): TlsChoice {
  if (Boolean(o.certFile) !== Boolean(o.keyFile)) throw new MeshError('TLS_BAD_OPTIONS', '--tls-cert and --tls-key go together: name both files');
  if (o.certFile && o.insecureHttp) throw new MeshError('TLS_BAD_OPTIONS', '--insecure-http contradicts --tls-cert/--tls-key');
  if (o.force && o.insecureHttp) throw new MeshError('TLS_BAD_OPTIONS', '--insecure-http contradicts --tls');
  if (o.certFile) return { kind: 'operator', certFile: o.certFile, keyFile: o.keyFile! };
  if (o.force) return { kind: 'local-ca' };
  if (isLoopbackHost(o.host) || o.insecureHttp) return { kind: 'off' };
  return { kind: 'local-ca' };
}

/** A DNS label a certificate may name (the machine's host name, when it is one). */
function dnsName(name: string): string | null {
  const n = name.toLowerCase();
  return /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/.test(n) ? n : null;
}

/**
 * The names this machine answers to: every interface address (loopback too, so the page works
 * at https://127.0.0.1), the bound address, `localhost`, and the host name with and without
 * `.local` (mDNS). `ca` is what the CA's constraints permit: the same addresses, `localhost`,
 * the host name, and every `.local` name.
 */
export function machineNames(bindHost: string): { leaf: CertNames; ca: CertNames } {
  const ips = new Set<string>();
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) if (!a.address.startsWith('fe80:')) ips.add(a.address);
  if (isIP(bindHost) && bindHost !== '0.0.0.0' && bindHost !== '::') ips.add(bindHost);
  const host = dnsName(hostname());
  const short = host?.replace(/\.local$/, '') ?? null;
  const dns = ['localhost', ...(short ? [short, `${short}.local`] : [])];
  return { leaf: { ips: [...ips], dns: [...new Set(dns)] }, ca: { ips: [...ips], dns: [...new Set(['localhost', 'local', ...(short ? [short] : [])])] } };
}

async function readIfThere(path: string): Promise<string | null> {
  return readFile(path, 'utf8').catch(() => null);
}

/** Writes a file readable by the owner only (private keys), or by all (certificates), atomically. */
async function writeFileMode(path: string, text: string, mode: number): Promise<void> {
  await writeFile(`${path}.tmp`, text, { mode });
  await chmod(`${path}.tmp`, mode); // the umask may have cleared bits of `mode`; never added any
  await rename(`${path}.tmp`, path);
}

function covers(certPem: string, names: CertNames, now: Date): boolean {
  const f = certFacts(certPem);
  return names.ips.every((ip) => f.ips.includes(ip)) && names.dns.every((d) => f.dns.includes(d)) && f.notAfter.getTime() - now.getTime() > RENEW_BEFORE_MS;
}

/**
 * The local CA and a leaf for `names`, from `dir` when what is there still fits, else made (and
 * written: keys 0600, the folder 0700). `log` hears what was made.
 */
export async function localCaTls(dir: string, names: { leaf: CertNames; ca: CertNames }, log: (line: string) => void = () => undefined, now = new Date()): Promise<ServerTls> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const paths = { ca: join(dir, 'ca.pem'), caKey: join(dir, 'ca-key.pem'), leaf: join(dir, 'server.pem'), leafKey: join(dir, 'server-key.pem') };
  let ca: KeyedCert | null = null;
  const [caPem, caKey] = await Promise.all([readIfThere(paths.ca), readIfThere(paths.caKey)]);
  if (caPem && caKey && caPermits(caPem, names.ca) && certFacts(caPem).notAfter.getTime() - now.getTime() > RENEW_BEFORE_MS * 30) ca = { cert: caPem, key: caKey };
  let madeCa = false;
  if (!ca) {
    ca = await makeLocalCa(names.ca, `gguf-mesh local CA (${dnsName(hostname()) ?? 'this machine'}, ${now.toISOString().slice(0, 10)})`, now);
    await writeFileMode(paths.caKey, ca.key, 0o600);
    await writeFileMode(paths.ca, ca.cert, 0o644);
    madeCa = true;
    log(`made a local certificate authority for ${[...names.ca.ips, ...names.ca.dns].join(', ')} (${paths.ca}); devices trust it once`);
  }
  let leaf: KeyedCert | null = null;
  const [leafPem, leafKey] = await Promise.all([readIfThere(paths.leaf), readIfThere(paths.leafKey)]);
  if (!madeCa && leafPem && leafKey && covers(leafPem, names.leaf, now)) leaf = { cert: leafPem, key: leafKey };
  if (!leaf) {
    leaf = await issueServerCert(ca, names.leaf, now);
    await writeFileMode(paths.leafKey, leaf.key, 0o600);
    await writeFileMode(paths.leaf, leaf.cert, 0o644);
    log(`issued a server certificate for ${[...names.leaf.ips, ...names.leaf.dns].join(', ')} until ${certFacts(leaf.cert).notAfter.toISOString().slice(0, 10)}`);
  }
  const fingerprint = certFingerprint(ca.cert);
  return { cert: leaf.cert + ca.cert, key: leaf.key, ca: { pem: ca.cert, fingerprint }, description: `local CA, sha256 ${formatFingerprint(fingerprint)}` };
}

/** An operator's certificate and key, checked to load and to belong together. */
export async function operatorTls(certFile: string, keyFile: string): Promise<ServerTls> {
  const [cert, key] = await Promise.all(
    [certFile, keyFile].map((f) =>
      readFile(f, 'utf8').catch((e: Error) => {
        throw new MeshError('TLS_BAD_CERT', `cannot read ${f}: ${e.message}`);
      }),
    ),
  );
  try {
    createSecureContext({ cert, key });
  } catch (e) {
    throw new MeshError('TLS_BAD_CERT', `${certFile} with ${keyFile}: ${(e as Error).message}`);
  }
  return { cert: cert!, key: key!, ca: null, description: `certificate ${certFile}` };
}

/** `ab12…` → `AB:12:…`, as browsers and phones show a fingerprint. */
export function formatFingerprint(hex: string): string {
  return hex.toUpperCase().match(/../g)!.join(':');
}

/**
 * The trust files, answered without the room secret (they are public): /tls/ca.crt (DER, what
 * phones install), /tls/ca.pem, /tls/ca.json (fingerprint and links, for the landing page).
 * True when it answered.
 */
export function serveTrustFiles(tls: ServerTls | null, req: IncomingMessage, res: ServerResponse, publicBase = ''): boolean {
  const path = new URL(req.url ?? '/', 'http://x').pathname;
  if (!path.startsWith('/tls/') || (req.method !== 'GET' && req.method !== 'HEAD')) return false;
  const send = (status: number, type: string, body: Uint8Array | string, extra: Record<string, string> = {}): true => {
    res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body), 'cache-control': 'no-cache', 'access-control-allow-origin': '*', ...extra });
    res.end(req.method === 'HEAD' ? undefined : body);
    return true;
  };
  const ca = tls?.ca;
  if (path === '/tls/ca.json') return send(200, 'application/json', JSON.stringify(ca ? { fingerprint: ca.fingerprint, display: formatFingerprint(ca.fingerprint), crt: '/tls/ca.crt', pem: '/tls/ca.pem', crtUrl: `${publicBase}/tls/ca.crt` } : { fingerprint: null }));
  if (!ca) return send(404, 'application/json', JSON.stringify({ error: { code: 'NOT_FOUND', message: 'this server uses no local CA' } }));
  if (path === '/tls/ca.crt') return send(200, 'application/x-x509-ca-cert', certDer(ca.pem), { 'content-disposition': 'attachment; filename="gguf-mesh-ca.crt"' });
  if (path === '/tls/ca.pem') return send(200, 'application/x-pem-file', ca.pem, { 'content-disposition': 'attachment; filename="gguf-mesh-ca.pem"' });
  return send(404, 'application/json', JSON.stringify({ error: { code: 'NOT_FOUND', message: `${path} is not a trust file` } }));
}
