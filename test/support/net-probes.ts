// Round trips and throughput between two lab hosts, measured from inside their namespaces:
// ICMP echo (a raw socket in /usr/bin/python3: this machine has no `ping`), a TCP echo and a UDP
// echo (node:net, node:dgram), and a TCP transfer timed to its last byte's acknowledgement.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import type { NetLab } from './netns.ts';
import { spawnCommand } from './mesh.ts';
import type { MeshProcess } from './mesh.ts';

const run = promisify(execFile);
const PORT = 7000;

// argv: host port. TCP: an echo on `port`, a sink on `port+1` that answers 'k' after `n` bytes (its first line); UDP: an echo.
const SERVER = `
const net = require('node:net'), dgram = require('node:dgram');
const [host, p] = process.argv.slice(1); const port = Number(p);
net.createServer((s) => { s.setNoDelay(true); s.pipe(s); }).listen(port, host);
net.createServer((s) => {
  let want = -1, got = 0, head = '';
  s.on('data', (d) => {
    if (want < 0) { head += d.toString('latin1'); const i = head.indexOf('\\n'); if (i < 0) return; want = Number(head.slice(0, i)); got = head.length - i - 1; }
    else got += d.length;
    if (got >= want) s.end('k');
  });
}).listen(port + 1, host);
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => u.send(m, r.port, r.address));
u.bind(port, host, () => console.log('listening'));
`;

// argv: host port n: n TCP round trips then n UDP round trips (ms each), as JSON
const ECHO_CLIENT = `
const net = require('node:net'), dgram = require('node:dgram');
const [host, p, count] = process.argv.slice(1); const port = Number(p), n = Number(count);
(async () => {
  const tcp = [], udp = [];
  const s = net.connect(port, host); s.setNoDelay(true);
  await new Promise((r, j) => { s.once('connect', r); s.once('error', j); });
  for (let i = 0; i < n; i++) { const t = performance.now(); s.write('x'.repeat(32)); await new Promise((r) => s.once('data', r)); tcp.push(performance.now() - t); }
  s.destroy();
  const u = dgram.createSocket('udp4');
  for (let i = 0; i < n; i++) {
    const t = performance.now(); u.send('y'.repeat(32), port, host);
    await new Promise((r, j) => { const to = setTimeout(() => j(new Error('udp echo lost')), 3000); u.once('message', () => { clearTimeout(to); r(); }); });
    udp.push(performance.now() - t);
  }
  u.close();
  console.log(JSON.stringify({ tcp, udp }));
})().catch((e) => { console.error(e); process.exit(1); });
`;

// argv: host port bytes: the ms from connecting to the sink's answer after `bytes` bytes
const BULK_CLIENT = `
const net = require('node:net');
const [host, p, b] = process.argv.slice(1); const bytes = Number(b);
const t = performance.now();
const s = net.connect(Number(p) + 1, host, () => { s.write(bytes + '\\n'); s.write(Buffer.alloc(bytes, 7)); });
s.on('data', () => { console.log(JSON.stringify({ ms: performance.now() - t })); s.destroy(); });
s.on('error', (e) => { console.error(e); process.exit(1); });
`;

// argv: dst n: n ICMP echo round trips (ms each), as JSON
const PING = `
import os, socket, struct, sys, time, json
dst, n = sys.argv[1], int(sys.argv[2])
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); sock.settimeout(3)
ident, out = os.getpid() & 0xffff, []
for seq in range(n):
    body = struct.pack('!BBHHH', 8, 0, 0, ident, seq) + b'gguf-mesh-probe!'
    pkt = body[:2] + struct.pack('!H', csum(body)) + body[4:]
    t = time.monotonic(); sock.sendto(pkt, (dst, 0))
    while True:
        data, addr = sock.recvfrom(2048)
        ihl = (data[0] & 15) * 4
        typ, _, _, rid, rseq = struct.unpack('!BBHHH', data[ihl:ihl + 8])
        if typ == 0 and rid == ident and rseq == seq: break
    out.append((time.monotonic() - t) * 1000)
print(json.dumps(out))
`;

export interface Rtts {
  icmp: number[];
  tcp: number[];
  udp: number[];
}

/** The echo servers in host `name` (TCP, UDP, the TCP sink), up once this resolves. */
export async function startEcho(lab: NetLab, name: string): Promise<MeshProcess> {
  const p = spawnCommand(lab.exec(name, [process.execPath, '-e', SERVER, lab.host(name).ip, String(PORT)]), {}, `echo server in ${name}`);
  await p.waitFor(/listening/, 10_000);
  return p;
}

async function inHost(lab: NetLab, name: string, argv: string[]): Promise<any> {
  const { stdout } = await run(lab.exec(name, [])[0]!, [...lab.exec(name, []).slice(1), ...argv], { timeout: 60_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!);
}

/** `n` round trips of each kind from host `from` to host `to` (which runs startEcho). */
export async function roundTrips(lab: NetLab, from: string, to: string, n: number): Promise<Rtts> {
  const ip = lab.host(to).ip;
  const icmp = (await inHost(lab, from, ['/usr/bin/python3', '-c', PING, ip, String(n)])) as number[];
  const { tcp, udp } = await inHost(lab, from, [process.execPath, '-e', ECHO_CLIENT, ip, String(PORT), String(n)]);
  return { icmp, tcp, udp };
}

/** kbit/s of a `bytes`-long TCP transfer from `from` to `to` (which runs startEcho). */
export async function throughputKbit(lab: NetLab, from: string, to: string, bytes: number): Promise<number> {
  const { ms } = await inHost(lab, from, [process.execPath, '-e', BULK_CLIENT, lab.host(to).ip, String(PORT), String(bytes)]);
  return (bytes * 8) / ms;
}

export const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
