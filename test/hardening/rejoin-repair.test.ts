// A node whose control socket the server dropped (it stopped answering heartbeats — a frozen
// process, a cut link) rejoins when it comes back, with back-off, as a new peer advertising the
// shard it holds verified. Meanwhile the route is repairing: the rejoined node is preferred as
// the replacement of the stage whose shard it holds, loads it from its cache (no bytes from the
// server), and the session that was open goes on with the same greedy tokens.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { RouteSessionClient } from '../../src/route/client.ts';
import { HttpLink } from '../../src/transport/http.ts';
import { killAll, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import type { ServeInfo } from '../support/mesh.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from '../support/models.ts';

afterAll(() => killAll());

const open = (s: ServeInfo, routeId: number) => RouteSessionClient.open(new HttpLink(s.base, { authorization: `Bearer ${s.secret}` }), routeId, { contextLength: 64 });

describe('a node dropped for silence', () => {
  it('rejoins, takes its stage back from its cache as the repair, and the open session gives the same tokens', async () => {
    const s = await spawnServe(await stories260K(), ['--min-peers', '2', '--plan-delay', '500', '--heartbeat', '200', '--heartbeat-timeout', '1500']);
    const nodes = ['front', 'back'].map((name) => spawnMesh(['node', '--join', s.joinUrl, '--name', name, '--cache-dir', mkdtempSync(join(tmpdir(), `rejoin-${name}-`))]));
    const route = await waitForRoute(s, 'ready', 90_000);
    expect(route.stages).toHaveLength(2);
    const lastName: string = route.stages[1].peer.name;

    // the uninterrupted run
    const ref = await open(s, route.id);
    const expected = [await ref.prefill(STORIES_PROMPT_TOKENS, 4)];
    while (expected.length < 12) expected.push(await ref.decode(expected.at(-1)!));
    await ref.close();

    const c = await open(s, route.id);
    const got = [await c.prefill(STORIES_PROMPT_TOKENS, 4)];
    while (got.length < 5) got.push(await c.decode(got.at(-1)!));
    // freeze the last stage past the heartbeat timeout: the server drops it; then let it go on
    const back = nodes[['front', 'back'].indexOf(lastName)]!;
    back.child.kill('SIGSTOP');
    await new Promise((r) => setTimeout(r, 3_000));
    back.child.kill('SIGCONT');
    while (got.length < 12) got.push(await c.decode(got.at(-1)!));
    await c.close();
    expect(got).toEqual(expected);

    const after = await waitForRoute(s, 'ready', 60_000);
    expect(after.id).toBe(route.id); // repaired in place
    expect(after.history).toContain('repairing');
    expect(after.stages[1].peer.name).toBe(lastName);
    expect(after.stages[1].peerId).not.toBe(route.stages[1].peerId); // it came back as a new peer
    expect(back.output()).toMatch(/control connection closed .*; rejoining/);
    expect(back.output().split('joined room').at(-1)).toMatch(/holding .*layer/);
    // its reload read no bytes from the server
    expect(s.proc.output()).toMatch(new RegExp(`stage 1 ready on ${after.stages[1].peerId} \\(0 bytes read`));
  }, 120_000);
});
