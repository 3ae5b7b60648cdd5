// The routed topology of test/support/netns.ts: hosts on links to a router namespace whose
// user-space shaper (test/support/shaper.py) delays, jitters and rate-caps every packet between
// them. Measured from inside the namespaces, against pairs with no delay in the same lab (so the
// shaper's own cost cancels): ICMP, TCP and UDP round trips grow by 2·(delay a + delay b), a
// capped link carries a TCP transfer at its rate, and closing the lab leaves no namespace and
// no shaper (nor does killing the test process, once the next lab has cleaned up).
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetLab } from './support/netns.ts';
import { killAll, spawnCommand } from './support/mesh.ts';
import { median, roundTrips, startEcho, throughputKbit } from './support/net-probes.ts';

const netnsList = (): string => execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Packets the router has handed its shaper so far. */
const shaped = (lab: NetLab): number => {
  const rt = lab.host('a').ns.replace(/-a$/, '-router');
  return JSON.parse(execFileSync('ip', ['-n', rt, '-s', '-j', 'link', 'show', 'tin'], { encoding: 'utf8' }))[0].stats64.tx.packets;
};

describe('a routed lab: every packet between hosts through the shaping router', () => {
  let lab: NetLab;

  beforeAll(async () => {
    lab = await NetLab.create({
      routed: {
        hosts: ['a', 'b', 'c', 'd', 'e', 'f', 'g'],
        // c, d, f: no delay (the baseline); e: 8 Mbit/s; g: 20 ms ± 10
        links: { a: { delayMs: 20 }, b: { delayMs: 30 }, e: { rateKbit: 8000 }, g: { delayMs: 20, jitterMs: 10 } },
      },
    });
    for (const h of ['b', 'd', 'f', 'g']) await startEcho(lab, h);
  });

  afterAll(async () => {
    await killAll();
    lab?.close();
  });

  it('adds 2·(20 + 30) ms to the round trip of ICMP, TCP and UDP alike', async () => {
    const before = shaped(lab);
    const base = await roundTrips(lab, 'c', 'd', 15);
    expect(shaped(lab) - before).toBeGreaterThanOrEqual(6 * 15); // the baseline crosses the shaper too (3 kinds × request and reply)
    const far = await roundTrips(lab, 'a', 'b', 15);
    const added = Object.fromEntries((['icmp', 'tcp', 'udp'] as const).map((k) => [k, median(far[k]) - median(base[k])]));
    console.log(`added RTT ms (median of 15, a↔b minus c↔d): ${JSON.stringify(added)}; baseline medians ${JSON.stringify(Object.fromEntries(Object.entries(base).map(([k, v]) => [k, median(v)])))}`);
    for (const k of ['icmp', 'tcp', 'udp'] as const) {
      expect(added[k], k).toBeGreaterThan(97);
      expect(added[k], k).toBeLessThan(115);
      expect(Math.min(...far[k]), k).toBeGreaterThan(100); // no packet overtakes its delay
    }
  });

  it('jitter spreads the round trips around 2·20 ms', async () => {
    const { tcp, udp } = await roundTrips(lab, 'c', 'g', 30);
    const all = [...tcp, ...udp].sort((x, y) => x - y);
    const p10 = all[Math.floor(all.length * 0.1)]!;
    const p90 = all[Math.floor(all.length * 0.9)]!;
    console.log(`jittered RTT ms: min ${all[0]!.toFixed(1)} p10 ${p10.toFixed(1)} median ${median(all).toFixed(1)} p90 ${p90.toFixed(1)} max ${all.at(-1)!.toFixed(1)}`);
    expect(all[0]).toBeGreaterThan(20); // 2·(20 − 10): a busy machine can only add
    expect(p90).toBeLessThan(62); // 2·(20 + 10), and the shaper's own time (the slowest tenth may meet a busy machine)
    expect(p90 - p10).toBeGreaterThan(5);
  });

  it('a link capped at 8 Mbit/s carries a TCP transfer at about that rate; an uncapped one far faster', async () => {
    const bytes = 1_000_000;
    const capped = await throughputKbit(lab, 'e', 'f', bytes);
    const free = await throughputKbit(lab, 'c', 'f', bytes);
    console.log(`TCP ${bytes} B: capped link ${capped.toFixed(0)} kbit/s (cap 8000), uncapped ${free.toFixed(0)} kbit/s`);
    expect(capped).toBeGreaterThan(0.7 * 8000);
    expect(capped).toBeLessThan(8000); // the cap counts IP headers too
    expect(free).toBeGreaterThan(3 * capped);
  });

  it('close() removes every namespace and stops the shaper', async () => {
    const other = await NetLab.create({ routed: { hosts: ['x', 'y'], links: { x: { delayMs: 5 } } } });
    const pid = other.shaper!.pid!;
    const names = [...other.hosts.values()].map((h) => h.ns);
    expect(alive(pid)).toBe(true);
    other.close();
    await new Promise((r) => setTimeout(r, 200));
    expect(alive(pid)).toBe(false);
    const list = netnsList();
    for (const ns of [...names, names[0]!.replace(/-x$/, '-router')]) expect(list).not.toContain(ns);
  });

  it('a test process killed without cleaning up leaves a shaper that exits, and namespaces the next lab removes', async () => {
    const holder = spawnCommand([process.execPath, 'bin/run-ts.js', 'test/fixtures/routed-lab-holder.ts'], {}, 'routed-lab-holder');
    const [line] = await holder.waitFor(/\{.*"shaper".*\}/, 30_000);
    const { shaper, namespaces } = JSON.parse(line) as { shaper: number; namespaces: string[] };
    expect(alive(shaper)).toBe(true);
    await holder.kill('SIGKILL');
    for (let i = 0; i < 50 && alive(shaper); i++) await new Promise((r) => setTimeout(r, 100));
    expect(alive(shaper)).toBe(false); // its stdin, the killed process's pipe, closed
    for (const ns of namespaces) expect(netnsList()).toContain(ns);
    const next = await NetLab.create({ routed: { hosts: ['z'] } });
    next.close();
    for (const ns of namespaces) expect(netnsList()).not.toContain(ns);
  });

  it('rejects a link for a host that is not in the lab, leaving nothing behind', async () => {
    const before = netnsList();
    await expect(NetLab.create({ routed: { hosts: ['x'], links: { z: { delayMs: 5 } } } })).rejects.toThrow(/a link for z/);
    expect(netnsList()).toBe(before);
  });
});
