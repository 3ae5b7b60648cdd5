// How a native process (node, generate --join) trusts a room server that presents a local CA
// (signaling-server/tls.ts): by pinning that CA's sha256 fingerprint, which the join link
// carries (`#…&ca=<hex>`) or `--ca-fingerprint` names, or by a CA file (`--ca-file`). Nothing
// here turns certificate checks off: the pin only chooses which CA to add to the system's
// roots, and every connection after it is verified in full (chain, validity, the server's
// address against the leaf's names, the CA's name constraints).
//
// Pinning reads the certificate chain the server presents in a TLS handshake (no request is
// sent on that connection), takes the certificate whose sha256 is the pin, and adds it; a
// server presenting no such certificate is refused (TLS_FINGERPRINT_MISMATCH). Node's fetch
// (undici) gets the CA through its global dispatcher, WebSockets through `tlsOptions()`.

import { connect, rootCertificates } from 'node:tls';
import type { DetailedPeerCertificate } from 'node:tls';
import { createHash, X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { MeshError } from '../errors.ts';
import { parseJoinUrl } from '../protocol/control.ts';

const extraCas: string[] = [];

/** 64 lowercase hex digits from `AB:CD:…`, `sha256:abcd…` or plain hex. */
export function parseFingerprint(text: string): string {
  const hex = text.trim().replace(/^sha-?256:/i, '').replace(/[:\s]/g, '').toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(hex)) throw new MeshError('BAD_CA_FINGERPRINT', `'${text}' is not a sha256 fingerprint (64 hex digits, colons allowed)`);
  return hex;
}

/** Options for a `ws` WebSocket or `tls.connect` that trust the pinned CAs beside the system's. */
export function tlsOptions(): { ca?: string[] } {
  return extraCas.length ? { ca: [...rootCertificates, ...extraCas] } : {};
}

/** Adds a CA (PEM) for every later fetch and WebSocket of this process. */
export async function trustCa(pem: string): Promise<void> {
  try {
    new X509Certificate(pem);
  } catch (e) {
    throw new MeshError('BAD_CA_CERT', `not a PEM certificate: ${(e as Error).message}`);
  }
  if (!extraCas.includes(pem)) extraCas.push(pem);
  const { Agent, setGlobalDispatcher } = await import('undici');
  setGlobalDispatcher(new Agent({ connect: { ca: [...rootCertificates, ...extraCas] } }));
}

function hostPort(base: string): { host: string; port: number; servername?: string } {
  const u = new URL(base);
  const host = u.hostname.replace(/^\[|\]$/g, '');
  return { host, port: Number(u.port || 443), ...(isIP(host) ? {} : { servername: host }) };
}

/** The certificates a server presents, leaf first (read from one handshake; nothing is sent). */
function presentedChain(base: string, timeoutMs = 10_000): Promise<DetailedPeerCertificate[]> {
  return new Promise((resolve, reject) => {
    // only to read the presented chain: the pinned CA found in it is verified against below
    const socket = connect({ ...hostPort(base), rejectUnauthorized: false });
    const timer = setTimeout(() => socket.destroy(new MeshError('JOIN_FAILED', `no TLS handshake within ${timeoutMs} ms`)), timeoutMs);
    socket.once('secureConnect', () => {
      clearTimeout(timer);
      const chain: DetailedPeerCertificate[] = [];
      for (let c: DetailedPeerCertificate | undefined = socket.getPeerCertificate(true); c?.raw && !chain.includes(c); c = c.issuerCertificate) chain.push(c);
      socket.destroy();
      resolve(chain);
    });
    socket.once('error', (e) => {
      clearTimeout(timer);
      reject(new MeshError('JOIN_FAILED', `cannot reach ${base}: ${e.message}`));
    });
  });
}

/** One fully verified handshake: the server's certificate chains to a trusted CA and names its address. */
function verifiedHandshake(base: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = connect({ ...hostPort(base), ...tlsOptions(), rejectUnauthorized: true });
    socket.once('secureConnect', () => {
      socket.destroy();
      resolve();
    });
    socket.once('error', (e) => reject(new MeshError('TLS_UNTRUSTED', `${base}: the certificate does not verify against the pinned CA: ${e.message}`)));
  });
}

/** Finds the CA with sha256 `fingerprint` in the chain `base` presents, trusts it, and checks a verified handshake. */
export async function pinServerCa(base: string, fingerprint: string): Promise<string> {
  const want = parseFingerprint(fingerprint);
  const chain = await presentedChain(base);
  const match = chain.find((c) => createHash('sha256').update(c.raw).digest('hex') === want);
  if (!match) {
    const got = chain.map((c) => createHash('sha256').update(c.raw).digest('hex')).join(', ') || 'no certificate';
    throw new MeshError('TLS_FINGERPRINT_MISMATCH', `${base} presented no CA certificate with sha256 ${want} (presented: ${got}); the link or --ca-fingerprint is not this server's`);
  }
  const pem = new X509Certificate(match.raw).toString();
  await trustCa(pem);
  await verifiedHandshake(base);
  return pem;
}

/**
 * Before joining: for an https:// link, trust `caFile`, else pin the fingerprint from
 * `fingerprint` or the link's `#ca=`; with neither, the system's roots alone apply (an
 * operator's certificate from a public CA needs nothing).
 */
export async function trustRoomServer(joinUrl: string, opts: { fingerprint?: string | undefined; caFile?: string | undefined } = {}): Promise<void> {
  const link = parseJoinUrl(joinUrl);
  if (!link.base.startsWith('https:')) return;
  if (opts.caFile) {
    const pem = await readFile(opts.caFile, 'utf8').catch((e: Error) => {
      throw new MeshError('BAD_CA_CERT', `cannot read ${opts.caFile}: ${e.message}`);
    });
    await trustCa(pem);
    await verifiedHandshake(link.base);
    return;
  }
  const pin = opts.fingerprint ?? link.params.get('ca');
  if (pin) await pinServerCa(link.base, pin);
}
