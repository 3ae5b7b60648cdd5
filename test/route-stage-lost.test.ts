// A stage that leaves mid-generation must be named as the cause, every time. Killing the last
// stage races two pieces of news at the server: its socket closing (the session fails with
// STAGE_LOST) and the step in flight failing at the stage before it — which may by then have
// dropped the session (SESSION_UNKNOWN at stage 1) or found its hop broken. Five kills, each
// watched through the three ways a client learns of it: a RemoteChain step, the OpenAI SSE
// error event, and the session's recorded state.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { readSse } from './support/sse.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { joinRoom, RemoteChain } from '../src/route/remote.ts';
import { argmax } from '../src/model/sampler.ts';
import { isMeshError } from '../src/errors.ts';

const ROUNDS = 5;
let serve: ServeInfo;
const initial: MeshProcess[] = [];

function spawnNode(name: string, memory: string): MeshProcess {
  return spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', memory, '--name', name, '--no-cache']);
}

/** Polls until the room has a ready route other than `previous`; returns its id and stage peers. */
async function readyRoute(previous: number | null): Promise<{ id: number; peers: string[] }> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
    if (room.route?.status === 'ready' && room.route.id !== previous) {
      const route = (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body;
      return { id: route.id, peers: route.stages.map((s: { peerId: string }) => s.peerId) };
    }
    if (Date.now() > deadline) throw new Error(`no new ready route: ${JSON.stringify(room)}\n${serve.proc.output()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A streamed completion until it ends; `onChunk` sees the number of text chunks so far. */
async function sseEvents(onChunk: (n: number) => void): Promise<Array<{ event?: string; data: string }>> {
  const res = await fetch(`${serve.base}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${serve.secret}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 400, temperature: 0, stream: true }),
  });
  const out: Array<{ event?: string; data: string }> = [];
  let chunks = 0;
  await readSse(res, (m) => {
    out.push(m);
    if (!m.event && m.data.includes('"text"')) onChunk(++chunks);
  });
  return out;
}

beforeAll(async () => {
  // repair off: this file is about the cause a client is told when a stage cannot be replaced
  serve = await spawnServe(await stories260K(), ['--min-peers', '3', '--repair-timeout', '0']);
  // memory 1 : 2 : 1 → layers [0,1) [1,4) [4,5); joined in order so stage 2 is the last to join
  for (const [i, m] of ['1GiB', '2GiB', '1GiB'].entries()) {
    const n = spawnNode(`n${i}`, m);
    await n.waitFor(/joined room/);
    initial.push(n);
  }
}, 120_000);

afterAll(async () => {
  await killAll();
});

describe('a stage killed mid-generation', () => {
  it(`is named with STAGE_LOST at its stage by every client, ${ROUNDS} kills in a row`, async () => {
    let routeId: number | null = null;
    let last = initial[2]!; // the node serving stage 2
    const seen: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const route = await readyRoute(routeId);
      routeId = route.id;
      expect(route.peers).toHaveLength(3);
      const victim = route.peers[2]!;
      expect(victim.startsWith(round === 0 ? 'n2-' : `r${round - 1}-`)).toBe(true);

      const joined = await joinRoom(serve.joinUrl, serve.secret);
      expect(joined.routeId).toBe(routeId);
      const chain = new RemoteChain(joined);
      await chain.openSession('s', 512);
      const wire = chain.wireIds.get('s')!;
      let stepsDone = 0;
      let sseChunks = 0;
      let kill: () => void = () => undefined;
      const killNow = new Promise<void>((resolve) => (kill = resolve));
      const maybeKill = (): void => {
        if (stepsDone >= 3 && sseChunks >= 3) kill();
      };
      // greedy decode through the chain until a step fails
      const chainError = (async (): Promise<unknown> => {
        try {
          let logits = await chain.forward('s', Int32Array.from(STORIES_PROMPT_TOKENS), 0);
          for (let pos = STORIES_PROMPT_TOKENS.length; pos < 500; pos++) {
            logits = await chain.forward('s', Int32Array.of(argmax(logits)), pos);
            stepsDone++;
            maybeKill();
          }
        } catch (e) {
          return e;
        }
        return null;
      })();
      const sse = sseEvents((n) => {
        sseChunks = n;
        maybeKill();
      });
      await killNow;
      await last.kill('SIGKILL');

      const err = await chainError;
      expect(isMeshError(err), String(err)).toBe(true);
      const e = err as { code: string; message: string; details?: { stage?: number } };
      seen.push(`${e.code}@${e.details?.stage}`);
      expect(e.code, e.message).toBe('STAGE_LOST');
      expect(e.details?.stage).toBe(2);
      expect(e.message).toContain(victim);

      const events = await sse;
      const error = events.find((x) => x.event === 'error');
      expect(error, JSON.stringify(events.slice(-3))).toBeDefined();
      const body = JSON.parse(error!.data).error;
      expect(body.code, body.message).toBe('STAGE_LOST');
      expect(body.stage).toBe(2);

      const info = (await getJson(`${serve.base}/v1/sessions/${wire}`, serve.secret)).body;
      expect(info.state).toBe('failed');
      expect(info.failure).toMatchObject({ code: 'STAGE_LOST', stage: 2 });
      await joined.close();

      // a new node takes the lost stage's place (it joins last, so the plan gives it stage 2)
      last = spawnNode(`r${round}`, '1GiB');
      await last.waitFor(/joined room/);
    }
    expect(seen).toEqual(Array(ROUNDS).fill('STAGE_LOST@2'));
  }, 300_000);
});
