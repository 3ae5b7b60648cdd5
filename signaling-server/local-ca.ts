// A certificate authority of one machine, for serving a LAN over HTTPS without a public name:
// the CA certificate is constrained to this machine's names (name constraints on its IP
// addresses and its `.local`/`localhost` names, path length 0, so a stolen CA key cannot mint
// a certificate for any other site), and the leaf it issues carries the addresses as IP SANs,
// serverAuth and a validity phones accept (Apple: at most 825 days for a locally trusted root).
// Keys are ECDSA P-256 with SHA-256 signatures, which every current browser and phone takes.
//
// Built on @peculiar/x509 (X.509 generation over WebCrypto); the name-constraints extension,
// which that library has no class for, is encoded with its own ASN.1 schema package.

// @peculiar/x509 2.x resolves its algorithm providers through tsyringe, which needs the
// Reflect metadata polyfill loaded first
import 'reflect-metadata';
import { createHash, webcrypto } from 'node:crypto';
import { isIP } from 'node:net';
import * as x509 from '@peculiar/x509';
import { AsnConvert } from '@peculiar/asn1-schema';
import { GeneralName, GeneralSubtree, GeneralSubtrees, NameConstraints, id_ce_nameConstraints } from '@peculiar/asn1-x509';
import { MeshError } from '../src/errors.ts';

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

/** What a certificate is for: IP addresses and DNS names. */
export interface CertNames {
  ips: string[];
  dns: string[];
}

export interface KeyedCert {
  /** PEM of the certificate */
  cert: string;
  /** PEM (PKCS#8) of its private key */
  key: string;
}

/** The leaf's validity: under the 825 days Apple allows for a locally trusted root's leaf. */
export const LEAF_DAYS = 800;
/** The CA outlives many leaves; re-trusting a CA on every device is the cost we avoid. */
export const CA_DAYS = 3650;

const ALG: EcKeyGenParams & EcdsaParams = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
const DAY_MS = 86_400_000;

/** PEM ending in a newline, so certificates concatenate into a chain. */
function withNewline(pem: string): string {
  return pem.endsWith('\n') ? pem : `${pem}\n`;
}

async function keyPair(): Promise<CryptoKeyPair> {
  return webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify']) as Promise<CryptoKeyPair>;
}

async function keyPem(key: CryptoKey): Promise<string> {
  const der = new Uint8Array(await webcrypto.subtle.exportKey('pkcs8', key));
  return withNewline(x509.PemConverter.encode(der.buffer, 'PRIVATE KEY'));
}

async function importKey(pem: string): Promise<CryptoKey> {
  try {
    return await webcrypto.subtle.importKey('pkcs8', x509.PemConverter.decodeFirst(pem), ALG, false, ['sign']);
  } catch (e) {
    throw new MeshError('TLS_BAD_KEY', `the CA private key is not a PKCS#8 ECDSA P-256 key: ${(e as Error).message}`);
  }
}

/** A random positive serial number (hex; the high bit clear so DER keeps it positive). */
function serial(): string {
  const b = webcrypto.getRandomValues(new Uint8Array(16));
  b[0]! &= 0x7f;
  return Buffer.from(b).toString('hex');
}

/** The IP subtree of one address: the address itself (/32 or /128). */
function ipSubtree(ip: string): string {
  return `${ip}/${isIP(ip) === 6 ? 128 : 32}`;
}

function nameConstraints(names: CertNames): x509.Extension {
  const subtrees = [
    ...names.ips.map((ip) => new GeneralSubtree({ base: new GeneralName({ iPAddress: ipSubtree(ip) }) })),
    ...names.dns.map((d) => new GeneralSubtree({ base: new GeneralName({ dNSName: d }) })),
  ];
  const value = AsnConvert.serialize(new NameConstraints({ permittedSubtrees: new GeneralSubtrees(subtrees) }));
  return new x509.Extension(id_ce_nameConstraints, true, value);
}

/**
 * A new CA permitted only `names`: each IP exactly, each DNS name and its subdomains (a
 * constraint `local` admits `host.local`).
 */
export async function makeLocalCa(names: CertNames, commonName: string, now = new Date()): Promise<KeyedCert> {
  const keys = await keyPair();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: [{ CN: [commonName] }, { O: ['gguf-mesh'] }],
    notBefore: new Date(now.getTime() - DAY_MS), // a phone whose clock runs a little behind still accepts it
    notAfter: new Date(now.getTime() + CA_DAYS * DAY_MS),
    keys,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      nameConstraints(names),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert: withNewline(cert.toString('pem')), key: await keyPem(keys.privateKey) };
}

/** A server certificate for `names`, signed by `ca`. */
export async function issueServerCert(ca: KeyedCert, names: CertNames, now = new Date(), days = LEAF_DAYS): Promise<KeyedCert> {
  const caCert = new x509.X509Certificate(ca.cert);
  const keys = await keyPair();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    // not a host name: verifiers match only the SANs, and a CN that looks like one would be checked against the constraints too
    subject: [{ CN: ['gguf-mesh server'] }, { O: ['gguf-mesh'] }],
    issuer: caCert.subjectName,
    notBefore: new Date(now.getTime() - DAY_MS),
    notAfter: new Date(now.getTime() + days * DAY_MS),
    publicKey: keys.publicKey,
    signingKey: await importKey(ca.key),
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension([...names.ips.map((value) => ({ type: 'ip' as const, value })), ...names.dns.map((value) => ({ type: 'dns' as const, value }))], false),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
    ],
  });
  return { cert: withNewline(cert.toString('pem')), key: await keyPem(keys.privateKey) };
}

/** sha256 of a certificate's DER bytes, 64 lowercase hex digits. */
export function certFingerprint(pem: string): string {
  return createHash('sha256').update(new Uint8Array(x509.PemConverter.decodeFirst(pem))).digest('hex');
}

/** The DER bytes of a PEM certificate (what phones install as a .crt). */
export function certDer(pem: string): Uint8Array {
  return new Uint8Array(x509.PemConverter.decodeFirst(pem));
}

/** The names a CA's name constraints permit, exactly as written (IP subtrees as `addr/prefix`). */
export function permittedNames(caPem: string): { ips: string[]; dns: string[] } {
  const ext = new x509.X509Certificate(caPem).getExtension(id_ce_nameConstraints);
  if (!ext) return { ips: [], dns: [] };
  const nc = AsnConvert.parse(ext.value, NameConstraints);
  const ips: string[] = [];
  const dns: string[] = [];
  for (const s of nc.permittedSubtrees ?? []) {
    if (s.base.iPAddress) ips.push(s.base.iPAddress);
    if (s.base.dNSName) dns.push(s.base.dNSName);
  }
  return { ips, dns };
}

/** Whether a DNS constraint admits a name: the name itself, or the name with labels added on the left. */
function dnsPermits(constraint: string, name: string): boolean {
  const c = constraint.toLowerCase().replace(/^\./, '');
  const n = name.toLowerCase();
  return n === c || n.endsWith(`.${c}`);
}

/** Whether the CA may sign a certificate for every one of `names`. */
export function caPermits(caPem: string, names: CertNames): boolean {
  const p = permittedNames(caPem);
  return names.ips.every((ip) => p.ips.includes(ipSubtree(ip))) && names.dns.every((d) => p.dns.some((c) => dnsPermits(c, d)));
}

/** Names and validity of a certificate, as verifiers read them. */
export function certFacts(pem: string): { ips: string[]; dns: string[]; notBefore: Date; notAfter: Date } {
  const cert = new x509.X509Certificate(pem);
  const san = cert.getExtension(x509.SubjectAlternativeNameExtension);
  const names = san?.names.items ?? [];
  return {
    ips: names.filter((n) => n.type === 'ip').map((n) => n.value),
    dns: names.filter((n) => n.type === 'dns').map((n) => n.value),
    notBefore: cert.notBefore,
    notAfter: cert.notAfter,
  };
}
