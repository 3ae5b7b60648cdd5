// A lab of hosts for multi-host tests: Linux network namespaces joined by veth pairs, made by
// the test and removed when it ends. Every address in it is one the lab assigned, and no
// namespace has a way out: a LAN is a bridge in a namespace of its own whose gateway address
// forwards nothing (Chromium gathers no ICE candidates without a default route, so hosts get
// one — to that dead end). Needs root and iproute2; when namespaces cannot be made, create()
// throws saying why (tests fail, never skip).
//
//   LAN       hosts on one bridge: they reach each other, multicast (mDNS) included
//   star      a centre host with one point-to-point link per leaf: leaves reach the centre's
//             addresses, never each other (the centre does not forward)
//   routed    every host on its own link to a router namespace that forwards all IPv4 between
//             them (TCP, UDP, ICMP alike) through a user-space shaper (shaper.py) adding each
//             link's delay, jitter and rate cap — on the way out of the source link and again on
//             the way into the destination's: RTT a↔b = 2·(delay a + delay b). Multicast is not
//             routed, so mDNS names do not resolve across it: tabs there meet on the
//             server-reflexive candidates serve's STUN gives them (e2e-lab-routed.test.ts)

import { execFile, execFileSync, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface LabHost {
  name: string;
  /** the namespace (`ip netns exec <ns> …`) */
  ns: string;
  /** the host's first address (what others use to reach it) */
  ip: string;
  /** every address of the host */
  ips: string[];
}

export interface LabSpec {
  /** hosts on one shared bridge, each gets 10.<net>.0.<k+1>/24 */
  lan?: string[];
  /** a centre host and leaves, each leaf on its own link 10.<net>.<k+1>.0/24 (centre .1, leaf .2) */
  star?: { centre: string; leaves: string[] };
  /** hosts each on a link 10.<net>.<k+1>.0/24 (router .1, host .2) to a router that shapes every packet between them */
  routed?: { hosts: string[]; links?: Record<string, LinkShape> };
}

/** What the router does to a host's link, in each direction (a packet crosses two links). */
export interface LinkShape {
  /** one-way delay of the link */
  delayMs?: number;
  /** ± uniformly around the delay, never reordering packets of one direction */
  jitterMs?: number;
  /** the link's rate in kbit/s, each direction; 0 or absent: no cap */
  rateKbit?: number;
}

const SHAPER = fileURLToPath(new URL('./shaper.py', import.meta.url));

const PREFIX = 'gmlab';
let counter = 0;
const live = new Set<NetLab>();

async function ip(...args: string[]): Promise<void> {
  try {
    await run('ip', args);
  } catch (e) {
    const err = e as Error & { stderr?: string };
    throw new Error(`ip ${args.join(' ')}: ${(err.stderr ?? err.message).trim()}`);
  }
}

async function sysctl(ns: string, ...settings: string[]): Promise<void> {
  try {
    await run('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', ...settings]);
  } catch (e) {
    const err = e as Error & { stderr?: string };
    throw new Error(`sysctl in ${ns} (${settings.join(' ')}): ${(err.stderr ?? err.message).trim()}`);
  }
}

/** Namespaces of labs whose test process is gone (killed before it could clean up). */
function removeStale(): void {
  let list = '';
  try {
    list = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  } catch {
    return;
  }
  for (const line of list.split('\n')) {
    const m = new RegExp(`^(${PREFIX}(\\d+)-\\S+)`).exec(line);
    if (!m || Number(m[2]) === process.pid) continue;
    try {
      process.kill(Number(m[2]), 0);
    } catch {
      try {
        execFileSync('ip', ['netns', 'del', m[1]!]);
      } catch {
        // already gone
      }
    }
  }
}

export class NetLab {
  readonly hosts = new Map<string, LabHost>();
  private readonly namespaces: string[] = [];
  private closed = false;
  /** the routed topology's shaping process (it also exits when its stdin, our pipe, closes) */
  shaper: ChildProcess | undefined;

  private constructor(private readonly id: string) {}

  /** Makes the namespaces, links and addresses of `spec`. */
  static async create(spec: LabSpec): Promise<NetLab> {
    if (process.platform !== 'linux') throw new Error(`network namespaces need Linux; this is ${process.platform}`);
    if (process.getuid?.() !== 0) throw new Error(`network namespaces need root (uid ${process.getuid?.()}); CI and this machine's tests run as root`);
    removeStale();
    const lab = new NetLab(`${PREFIX}${process.pid}-${counter++}`);
    live.add(lab);
    try {
      let net = 201;
      if (spec.lan) await lab.makeLan(net++, spec.lan);
      if (spec.star) await lab.makeStar(net++, spec.star.centre, spec.star.leaves);
      if (spec.routed) await lab.makeRouted(net++, spec.routed.hosts, spec.routed.links ?? {});
    } catch (e) {
      lab.close();
      throw new Error(`cannot make the test network (network namespaces and veth pairs): ${(e as Error).message}`);
    }
    return lab;
  }

  host(name: string): LabHost {
    const h = this.hosts.get(name);
    if (!h) throw new Error(`no host ${name} in this lab (${[...this.hosts.keys()].join(', ')})`);
    return h;
  }

  private async namespace(name: string): Promise<string> {
    const ns = `${this.id}-${name}`;
    await ip('netns', 'add', ns);
    this.namespaces.push(ns);
    await ip('-n', ns, 'link', 'set', 'lo', 'up');
    return ns;
  }

  private async addHost(name: string, addr: string): Promise<LabHost> {
    const existing = this.hosts.get(name);
    if (existing) {
      existing.ips.push(addr);
      return existing;
    }
    const h: LabHost = { name, ns: await this.namespace(name), ip: addr, ips: [addr] };
    this.hosts.set(name, h);
    return h;
  }

  /** A veth pair: `ifA` in namespace `a`, `ifB` in namespace `b`, both up. */
  private async veth(a: string, ifA: string, b: string, ifB: string): Promise<void> {
    await ip('link', 'add', ifA, 'netns', a, 'type', 'veth', 'peer', 'name', ifB, 'netns', b);
    await ip('-n', a, 'link', 'set', ifA, 'up');
    await ip('-n', b, 'link', 'set', ifB, 'up');
  }

  private async makeLan(net: number, names: string[]): Promise<void> {
    const sw = await this.namespace('lan');
    await ip('-n', sw, 'link', 'add', 'br0', 'type', 'bridge');
    await ip('-n', sw, 'link', 'set', 'br0', 'up');
    const gateway = `10.${net}.0.254`;
    await ip('-n', sw, 'addr', 'add', `${gateway}/24`, 'dev', 'br0'); // forwards nothing (a new namespace has ip_forward 0)
    for (const [k, name] of names.entries()) {
      const h = await this.addHost(name, `10.${net}.0.${k + 1}`);
      await this.veth(h.ns, 'lan0', sw, `p${k}`);
      await ip('-n', sw, 'link', 'set', `p${k}`, 'master', 'br0');
      await ip('-n', h.ns, 'addr', 'add', `${h.ips.at(-1)}/24`, 'dev', 'lan0');
      await ip('-n', h.ns, 'route', 'add', 'default', 'via', gateway);
    }
  }

  private async makeStar(net: number, centreName: string, leaves: string[]): Promise<void> {
    for (const [k, name] of leaves.entries()) {
      const centre = await this.addHost(centreName, `10.${net}.${k + 1}.1`);
      const leaf = await this.addHost(name, `10.${net}.${k + 1}.2`);
      await this.veth(centre.ns, `leaf${k}`, leaf.ns, 'up0');
      await ip('-n', centre.ns, 'addr', 'add', `10.${net}.${k + 1}.1/24`, 'dev', `leaf${k}`);
      await ip('-n', leaf.ns, 'addr', 'add', `10.${net}.${k + 1}.2/24`, 'dev', 'up0');
      // every centre address through this link; the centre answers for its own addresses only
      await ip('-n', leaf.ns, 'route', 'add', 'default', 'via', `10.${net}.${k + 1}.1`);
    }
  }

  private async makeRouted(net: number, names: string[], links: Record<string, LinkShape>): Promise<void> {
    for (const name of Object.keys(links)) if (!names.includes(name)) throw new Error(`routed: a link for ${name}, which is not one of the hosts (${names.join(', ')})`);
    const rt = await this.namespace('router');
    const shapes: Record<string, LinkShape> = {};
    for (const [k, name] of names.entries()) {
      const h = await this.addHost(name, `10.${net}.${k + 1}.2`);
      await this.veth(rt, `h${k}`, h.ns, 'up0');
      await ip('-n', rt, 'addr', 'add', `10.${net}.${k + 1}.1/24`, 'dev', `h${k}`);
      await ip('-n', h.ns, 'addr', 'add', `${h.ip}/24`, 'dev', 'up0');
      await ip('-n', h.ns, 'route', 'add', 'default', 'via', `10.${net}.${k + 1}.1`);
      shapes[h.ip] = links[name] ?? {};
    }
    await this.startShaper(rt, shapes);
    // packets written to tout arrive from no host's link: no reverse-path check on them
    await sysctl(rt, 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.default.rp_filter=0', 'net.ipv4.conf.tout.rp_filter=0', 'net.ipv4.conf.all.send_redirects=0');
    for (const dev of ['tin', 'tout']) await ip('-n', rt, 'link', 'set', dev, 'up');
    // whatever a host's link brings (and is not for the router itself: the local table comes first) goes to the shaper
    await ip('-n', rt, 'route', 'add', 'default', 'dev', 'tin', 'table', '100');
    for (const k of names.keys()) await ip('-n', rt, 'rule', 'add', 'iif', `h${k}`, 'lookup', '100', 'pref', '100');
  }

  /** The shaper in the router namespace, once it holds its two TUN devices. */
  private async startShaper(rt: string, links: Record<string, LinkShape>): Promise<void> {
    const child = spawn('ip', ['netns', 'exec', rt, '/usr/bin/python3', SHAPER, JSON.stringify({ links })], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.shaper = child;
    let out = '';
    await new Promise<void>((resolve, reject) => {
      const onData = (d: Buffer): void => {
        out += d.toString();
        if (out.includes('shaping\n')) resolve();
      };
      child.stdout!.on('data', onData);
      child.stderr!.on('data', onData);
      child.once('exit', (code) => reject(new Error(`the shaper exited with ${code}: ${out.trim()}`)));
      child.once('error', reject);
    });
    child.stdout!.removeAllListeners('data').resume();
    child.stderr!.removeAllListeners('data').resume();
  }

  /** The routed topology: host `name`'s link shaped anew from now on (a link that got longer or slower mid-test). */
  async reshape(name: string, shape: LinkShape): Promise<void> {
    const shaper = this.shaper;
    if (!shaper || shaper.exitCode !== null) throw new Error('reshape: this lab has no running shaper (only the routed topology shapes links)');
    const done = new Promise<void>((resolve, reject) => {
      const onData = (d: Buffer): void => {
        if (!d.toString().includes('reshaped')) return;
        shaper.stdout!.off('data', onData);
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => reject(new Error(`the shaper did not reshape ${name}'s link within 5 s`)), 5000);
      shaper.stdout!.on('data', onData);
    });
    shaper.stdin!.write(`${JSON.stringify({ links: { [this.host(name).ip]: shape } })}\n`);
    await done;
  }

  /** The command line that runs `argv` inside host `name`. */
  exec(name: string, argv: string[]): string[] {
    return ['ip', 'netns', 'exec', this.host(name).ns, ...argv];
  }

  /** Removes every namespace (their links and addresses go with them). Processes inside should be stopped first. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    live.delete(this);
    if (this.shaper?.exitCode === null && this.shaper.pid) {
      try {
        process.kill(this.shaper.pid, 'SIGKILL'); // `ip netns exec` has become python itself
      } catch {
        // already gone
      }
    }
    for (const ns of this.namespaces.reverse()) {
      try {
        execFileSync('ip', ['netns', 'del', ns]);
      } catch {
        // already gone
      }
    }
  }
}

// a test process that exits without afterAll (a failed hook, a signal vitest forwards) still cleans up
process.once('exit', () => {
  for (const lab of [...live]) lab.close();
});
