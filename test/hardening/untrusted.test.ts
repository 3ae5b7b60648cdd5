// Untrusted stages (a public room where visitors donate compute): serve --trusted-secret pins
// the first and last stages to trusted nodes (node --trusted), so no donor sees token ids or
// logits; the trusted first stage re-runs the donors' layers for a fraction of sessions and the
// server compares with what reached the trusted last stage. An honest donor passes and the
// route gives llama.cpp's tokens; a donor that shifts its hidden states is excluded, the route
// is planned again without it, and generation goes on right — or, with an honest donor standing
// by as a spare, the route is repaired onto it (session repair) without being planned again.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { planRoute } from '../../src/route/planner.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import type { ServeInfo } from '../support/mesh.ts';
import { STORIES_CONTINUATION_PREFIX, stories260K } from '../support/models.ts';
import { startLyingPeer } from './lying-peer.ts';
import type { LyingPeer } from './lying-peer.ts';

let donor: LyingPeer | undefined;
afterAll(async () => {
  await donor?.close();
  await killAll();
});

const TRUSTED = 'trusted-test-secret';

/** A public room with spot checks on every session, two trusted nodes and a lying donor, its route ready as trusted, donor, trusted. */
async function publicRoom(): Promise<{ s: ServeInfo; route: any; setLying: (on: boolean) => void }> {
  // a repair waits 3 s for a replacement (a spare, when there is one, is ready long before), not 30
  const s = await spawnServe(await stories260K(), ['--trusted-secret', TRUSTED, '--spot-check', '1', '--min-peers', '2', '--plan-delay', '4000', '--repair-timeout', '3000']);
  for (const name of ['first', 'last']) spawnMesh(['node', '--join', s.joinUrl, '--trusted', TRUSTED, '--name', name, '--cache-dir', mkdtempSync(join(tmpdir(), `trusted-${name}-`))]);
  let lying = false;
  // the trusted nodes join first, the donor within the plan delay: the join order must not matter
  for (let i = 0; i < 100 && (await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret)).body.peers < 2; i++) await new Promise((r) => setTimeout(r, 100));
  donor = await startLyingPeer(s.joinUrl, 'donor', () => lying);
  const route = await waitForRoute(s, 'ready', 90_000);
  expect(who(route)).toEqual(['trusted', 'donor', 'trusted']);
  return { s, route, setLying: (on) => (lying = on) };
}

const who = (r: { stages: Array<{ peer: { name: string; trusted: boolean } }> }) => r.stages.map((st) => (st.peer.trusted ? 'trusted' : st.peer.name));

/** Polls until the donor is excluded; its reason. */
async function excludedDonor(s: ServeInfo): Promise<string | null> {
  const deadline = Date.now() + 30_000;
  let excluded = null;
  while (!excluded && Date.now() < deadline) {
    excluded = (await getJson(`${s.base}/v1/rooms/${s.roomId}/peers`, s.secret)).body.peers.find((p: { name: string }) => p.name === 'donor')?.excluded ?? null;
    if (!excluded) await new Promise((r) => setTimeout(r, 100));
  }
  return excluded;
}

describe('the planner in a public room', () => {
  const peers = (ids: string[]) => ids.map((id) => ({ id, memoryBytes: 1000 }));
  const shardBytes = (r: { start: number; end: number }) => (r.end - r.start) * 100;
  it('puts trusted peers at both ends and donors between, whatever the join order', () => {
    const plan = planRoute({ nLayer: 5, peers: peers(['d1', 't1', 'd2', 't2']), shardBytes, trusted: (id) => id.startsWith('t') });
    expect(plan.ok && plan.stages.map((s) => s.peerId)).toEqual(['t1', 'd1', 'd2', 't2']);
  });
  it('serves from one trusted peer that holds the whole model, and refuses with a reason otherwise', () => {
    expect(planRoute({ nLayer: 5, peers: peers(['d1', 't1']), shardBytes, trusted: (id) => id === 't1' })).toMatchObject({ ok: true, stages: [{ peerId: 't1', shard: { start: 0, end: 5 } }] });
    expect(planRoute({ nLayer: 5, peers: peers(['d1', 'd2']), shardBytes, trusted: () => false })).toMatchObject({ ok: false, reason: expect.stringContaining('trusted') });
    expect(planRoute({ nLayer: 50, peers: peers(['d1', 't1']), shardBytes, trusted: (id) => id === 't1' })).toMatchObject({ ok: false, reason: expect.stringContaining('two trusted') });
  });
});

async function complete(s: ServeInfo): Promise<{ status: number; text: string }> {
  const res = await fetch(`${s.base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 24, temperature: 0 }),
  });
  const body = (await res.json()) as { choices?: Array<{ text: string }> };
  return { status: res.status, text: body.choices?.[0]?.text ?? '' };
}

describe('spot checks', () => {
  it('pass for an honest donor and exclude one that lies; the route goes on without it', async () => {
    const { s, route, setLying } = await publicRoom();
    const honest = await complete(s);
    expect(honest.status).toBe(200);
    expect(STORIES_CONTINUATION_PREFIX.startsWith(honest.text.slice(0, 40))).toBe(true);
    const room = async () => (await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret)).body;
    expect((await room()).spotChecks).toMatchObject({ failed: 0 });
    expect((await room()).spotChecks.passed).toBeGreaterThan(5);

    setLying(true);
    const during = await complete(s); // fails over when the donor is excluded mid-reply, or finishes first
    const excluded = await excludedDonor(s);
    expect(excluded).toMatch(/spot check .* differ from a trusted re-run/);
    expect((await room()).spotChecks.failed).toBeGreaterThan(0);
    console.log(`untrusted: the lying donor was excluded (${excluded}); the request in flight got ${during.status}`);

    // no spare: the repair finds no replacement and the room plans a route without the donor
    const next = await waitForRoute(s, 'ready', 60_000);
    expect(next.id).not.toBe(route.id);
    expect(who(next)).toEqual(['trusted', 'trusted']);
    const after = await complete(s);
    expect(after.status).toBe(200);
    expect(after.text).toBe(honest.text);
    await donor?.close();
    donor = undefined;
    await killAll();
  });

  it("repair an excluded donor's stage onto an honest spare: the same route, the same text, no replan", async () => {
    const { s, route, setLying } = await publicRoom();
    const honest = await complete(s);
    expect(honest.status).toBe(200);
    // an honest donor joins the ready route: it becomes a spare for the middle stage (the only one a donor may take)
    spawnMesh(['node', '--join', s.joinUrl, '--name', 'spare', '--cache-dir', mkdtempSync(join(tmpdir(), 'donor-spare-'))]);
    const deadline = Date.now() + 60_000;
    let spare: { stage: number; status: string } | undefined;
    while (spare?.status !== 'ready' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
      spare = (await getJson(`${s.base}/v1/routes/${route.id}`, s.secret)).body.spares?.[0];
    }
    expect(spare).toMatchObject({ stage: 1, status: 'ready' });

    setLying(true);
    await complete(s);
    expect(await excludedDonor(s)).toMatch(/spot check/);
    const repaired = await waitForRoute(s, 'ready', 60_000);
    expect(repaired.id).toBe(route.id); // repaired in place, not planned again
    expect(who(repaired)).toEqual(['trusted', 'spare', 'trusted']);
    expect(repaired.history).toContain('repairing');
    const after = await complete(s);
    expect(after.status).toBe(200);
    expect(after.text).toBe(honest.text);
    console.log(`untrusted: the excluded donor's stage went to the spare; route ${route.id} history ${repaired.history.join(' → ')}`);
  });
});
