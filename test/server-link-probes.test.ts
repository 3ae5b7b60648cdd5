// The room's link matrix (signaling-server/link-matrix.ts, link-probes.ts) with real processes on
// this machine: each node that joins times its frame link to every listening peer already there
// (`probe-links`, peer/link-probe.ts) and the room shows the round trips in its peer list; a
// node whose advertised address answers nothing is logged as not measured (the planner keeps the
// star for that pair) and still joins; a node that leaves takes its links with it. Plus the
// matrix's own rules.
import { afterAll, describe, expect, it } from 'vitest';
import { stories260K } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import { ICE_RTT_RESOLUTION_MS, LINK_WINDOW, LinkMatrix } from '../signaling-server/link-matrix.ts';
import { LinkProbes } from '../signaling-server/link-probes.ts';
import { runCli } from './support/cli.ts';

afterAll(killAll);

const peersOf = async (serve: Awaited<ReturnType<typeof spawnServe>>): Promise<any[]> => (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;

describe('link probes between native nodes', () => {
  it('measures each pair a joining node can reach, logs the one it cannot, and forgets the links of a node that left', async () => {
    const serve = await spawnServe(await stories260K(), ['--min-peers', '9', '--standby', 'off']);
    const node = (name: string, extra: string[] = []) => spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--no-cache', '--name', name, ...extra]);
    // first, a node whose advertised address nobody listens on
    await node('ghost', ['--advertise', 'ws://127.0.0.1:9/v1/frames']).waitFor(/joined room/);
    await node('a').waitFor(/joined room/);
    await serve.proc.waitFor(/link a-\w+ → ghost-\w+: not measured \(/, 20_000);
    // then one 25 ms away from everything (a test link delay on all it sends and receives)
    const b = node('b', ['--test-link-delay-ms', '25']);
    await b.waitFor(/joined room/);
    await serve.proc.waitFor(/link b-\w+ → ghost-\w+: not measured \(/, 20_000);
    await expect.poll(async () => Object.keys((await peersOf(serve)).find((p) => p.name === 'b')?.links ?? {}), { timeout: 20_000 }).toHaveLength(1);
    const peers = await peersOf(serve);
    const [pa, pb, ghost] = ['a', 'b', 'ghost'].map((n) => peers.find((p) => p.name === n));
    // b timed its link to a: its own delay on every frame's way out and back
    expect(pb.links[pa.id]).toMatchObject({ source: 'probe' });
    // (a timer may fire up to a millisecond early against performance.now(): libuv dates it from the loop's cached clock)
    expect(pb.links[pa.id].rttMs).toBeGreaterThanOrEqual(2 * 25 - 2);
    expect(pb.links[pa.id].rttMs).toBeLessThan(2 * 25 + 40);
    expect(pa.links).toEqual({ [pb.id]: pb.links[pa.id] }); // one figure per pair, seen from either end
    expect(ghost.links).toEqual({}); // unreachable: the planner keeps the star through the server for it
    await b.kill('SIGKILL');
    await expect.poll(async () => (await peersOf(serve)).find((p) => p.name === 'a')?.links, { timeout: 20_000 }).toEqual({});
  }, 90_000);
});

describe('the link matrix', () => {
  it('keeps the fastest of a pair\'s recent samples, either way round, and nothing for a peer with itself', () => {
    const m = new LinkMatrix();
    m.record('a', 'b', 4, 'probe');
    m.record('b', 'a', 2.5, 'ice');
    m.record('a', 'a', 1, 'probe');
    m.record('a', 'c', Number.NaN, 'probe');
    expect(m.rttMs('a', 'b')).toBe(2.5);
    expect(m.oneWayMs('b', 'a')).toBe(1.25);
    expect(m.rttMs('a', 'a')).toBeUndefined();
    expect(m.rttMs('a', 'c')).toBeUndefined();
    expect(m.of('a')).toEqual({ b: { rttMs: 2.5, source: 'ice' } });
    // the window moves on: as many later samples as it holds push the fast one out
    for (let i = 0; i < LINK_WINDOW; i++) m.record('a', 'b', 10 + i, 'probe');
    expect(m.rttMs('a', 'b')).toBe(10);
    m.record('c', 'b', 7, 'probe');
    // ICE reads a LAN hop under its millisecond as 0: half of one, not a free link; a probe's 0 stays
    m.record('d', 'e', 0, 'ice');
    expect(m.rttMs('d', 'e')).toBe(ICE_RTT_RESOLUTION_MS / 2);
    m.record('d', 'f', 0, 'probe');
    expect(m.rttMs('d', 'f')).toBe(0);
    m.drop('d');
    m.drop('b');
    expect(m.records()).toEqual([]);
  });
});

describe('link probe rounds', () => {
  it('serve --help documents --link-probe-interval; a negative one exits 2 naming the flag', async () => {
    const help = await runCli(['serve', '--help']);
    expect(help.stdout + help.stderr).toMatch(/--link-probe-interval <ms>.*only as peers join/s);
    const bad = await runCli(['serve', '--port', '0', '--ui', 'off', '--link-probe-interval', '-5']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--link-probe-interval must be 0 or more, got -5');
  });

  const peer = (id: string, probes: boolean, listen: boolean): any => ({ id, gone: false, hello: { probesLinks: probes, ...(listen ? { listen: `ws://${id}/v1/frames` } : {}) } });
  const fakeRoom = (...ps: any[]) => {
    const sent: Array<{ to: string; msg: any }> = [];
    const logs: string[] = [];
    return { peers: new Map(ps.map((p) => [p.id, p])), links: new LinkMatrix(), send: (p: any, msg: any) => sent.push({ to: p.id, msg }), log: (l: string) => logs.push(l), sent, logs };
  };

  it('times every pair again once, by an end that probes, skipping a prober still busy, and logs an unreachable pair once', () => {
    // a and b probe and listen, c only listens (a tab-less node of an older build), d only probes
    const room = fakeRoom(peer('a', true, true), peer('b', true, true), peer('c', false, true), peer('d', true, false));
    const probes = new LinkProbes(room, 0);
    probes.again();
    const asked = Object.fromEntries(room.sent.map((s) => [s.to, s.msg.targets.map((t: any) => t.peer)]));
    // a–b, a–c by a; b–c by b; d times a, b and c (no one can time d: it does not listen)
    expect(asked).toEqual({ a: ['b', 'c'], b: ['c'], d: ['a', 'b', 'c'] });
    const id = (to: string) => room.sent.find((s) => s.to === to)!.msg.id;
    probes.onResults(room.peers.get('a') as any, { t: 'links-probed', id: id('a'), results: [{ peer: 'b', rttMs: 0.5 }, { peer: 'c', error: 'connect ECONNREFUSED' }] });
    expect(room.links.rttMs('a', 'b')).toBe(0.5);
    // the next round: b and d have not answered, so only a is asked again
    room.sent.length = 0;
    probes.again();
    expect(room.sent.map((s) => s.to)).toEqual(['a']);
    probes.onResults(room.peers.get('a') as any, { t: 'links-probed', id: room.sent[0]!.msg.id, results: [{ peer: 'b', rttMs: 80 }, { peer: 'c', error: 'connect ECONNREFUSED' }] });
    expect(room.logs.filter((l) => l.includes('a → c: not measured'))).toHaveLength(1);
    // a longer link reads so once its fast samples have left the window
    expect(room.links.rttMs('a', 'b')).toBe(0.5);
    for (let i = 1; i < LINK_WINDOW; i++) room.links.record('a', 'b', 80 + i, 'probe');
    expect(room.links.rttMs('a', 'b')).toBe(80);
    // an answer to a probe the room did not ask of that peer is ignored
    probes.onResults(room.peers.get('b') as any, { t: 'links-probed', id: 999, results: [{ peer: 'a', rttMs: 0.1 }] });
    expect(room.links.rttMs('a', 'b')).toBe(80);
    // a pair no longer reachable directly (b left the LAN) loses its old figure: the star speaks for it
    room.sent.length = 0;
    probes.again();
    const round = room.sent.find((s) => s.to === 'a')!.msg;
    probes.onResults(room.peers.get('a') as any, { t: 'links-probed', id: round.id, results: [{ peer: 'b', error: 'connect ETIMEDOUT' }] });
    expect(room.links.rttMs('a', 'b')).toBeUndefined();
    expect(room.logs.filter((l) => l.includes('a → b: not measured'))).toHaveLength(1);
    probes.stop();
  });
});
