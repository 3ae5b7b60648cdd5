// The ring (FrameFlag.Ring, src/route/ring-ahead.ts, src/peer/stage-ring.ts): a 3-stage route
// of real CPU engines on stories260K over loopback WebSockets, where the session manager sends
// each decode step's successor ahead and the last stage hands its token straight to stage 0.
// Its tokens are the one-way path's — greedy and seeded sampling, a client that leaves the ring
// (another token, a prefill, a rewind) and comes back — and every step sent ahead is taken or
// dropped, never left waiting; stage 0 refuses a ring token that is not for it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createNodeCpuBackend } from '../src/backends/cpu/node-threads.ts';
import type { StageBackend } from '../src/backends/types.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { startLoopbackRoute } from '../src/peer/loopback.ts';
import type { LoopbackRoute } from '../src/peer/loopback.ts';
import { stageSampler } from '../src/peer/peer-core.ts';
import { RingInbox, ringTokenFrame } from '../src/peer/stage-ring.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import type { SessionOpenBody } from '../src/protocol/session.ts';
import { newSessionId } from '../src/protocol/session.ts';
import { FrameType, makeFrame } from '../src/protocol/frame.ts';
import { jsonFrame } from '../src/protocol/payload.ts';
import { MeshError } from '../src/errors.ts';
import { stories260K } from './support/models.ts';

const CUT = [0, 2, 3, 5];
const PROMPT = [1, 403, 407, 263, 931, 29892, 322, 278, 6635, 29889].map((t) => t % 512);
let source: TensorSource;
let backends: StageBackend[] = [];
let route: LoopbackRoute;

const open = (body: Partial<SessionOpenBody>): Promise<RouteSessionClient> => RouteSessionClient.open(route.clientLink, route.route.id, { contextLength: 256, hiddenDtype: 'f32', ...body });

/** Decodes `n` tokens after the prompt, feeding each back (or `override(i, token)` instead). */
async function generate(c: RouteSessionClient, n: number, override: (i: number, t: number) => number = (_, t) => t): Promise<number[]> {
  const out = [await c.prefill(PROMPT)];
  for (let i = 0; i < n; i++) out.push(await c.decode(override(i, out[out.length - 1]!)));
  return out;
}

const last = () => route.services[route.services.length - 1]!;

describe('the ring over a 3-stage loopback route', () => {
  beforeAll(async () => {
    source = await openTensorSource(await stories260K());
    backends = [];
    for (let i = 0; i < 3; i++) {
      const b = createNodeCpuBackend({ threads: 1 });
      await b.load(source, { start: CUT[i]!, end: CUT[i + 1]! });
      backends.push(b);
    }
    route = await startLoopbackRoute(backends.map((backend, i) => ({ backend, shard: { start: CUT[i]!, end: CUT[i + 1]! } })), { nLayer: 5, samplerFactory: stageSampler });
    expect(route.route.ring?.()).toBe(true);
  }, 60_000);
  afterAll(async () => {
    await route?.close();
    for (const b of backends) await b.dispose();
    await source?.close();
  });

  it('gives the one-way path\'s tokens, greedy, each step but the first taken from the one sent ahead', async () => {
    const direct = await open({});
    const ring = await open({ tokenPath: 'ring' });
    const ringedBefore = last().tokensRinged;
    const a = await generate(direct, 40);
    const b = await generate(ring, 40);
    expect(b).toEqual(a);
    const info = await ring.info();
    expect(info.ring).toEqual({ sentAhead: 40, taken: 39, dropped: 0 });
    // each ring step's token went to stage 0 too (and the step ahead of the last one's, once it ran)
    expect(last().tokensRinged - ringedBefore).toBeGreaterThanOrEqual(40);
    expect(last().tokensRinged - ringedBefore).toBeLessThanOrEqual(41);
    expect(info.generatedTokens).toBe(41);
    await direct.close();
    await ring.close();
  });

  it('gives the same tokens with seeded sampling, and when the client leaves the ring and comes back', async () => {
    const sampler = { temperature: 0.9, topK: 40, seed: 1234 };
    // every 7th step feeds a token of its own (as a grammar or a tool call would): the step ahead is dropped there
    const override = (i: number, t: number): number => (i % 7 === 3 ? (t + 11) % 512 : t);
    const direct = await open({ sampler });
    const ring = await open({ sampler, tokenPath: 'ring' });
    const a = await generate(direct, 30, override);
    const b = await generate(ring, 30, override);
    expect(b).toEqual(a);
    const s = (await ring.info()).ring!;
    expect(s.dropped).toBe(4); // i = 3, 10, 17, 24
    expect(s.taken).toBe(30 - 1 - 4);
    // a prefill in mid-session, then decoding again: the step ahead is dropped first
    const more = [5, 6, 7];
    const tailA = [await direct.prefill(more)];
    const tailB = [await ring.prefill(more)];
    for (let i = 0; i < 5; i++) {
      tailA.push(await direct.decode(tailA[tailA.length - 1]!));
      tailB.push(await ring.decode(tailB[tailB.length - 1]!));
    }
    expect(tailB).toEqual(tailA);
    await direct.close();
    await ring.close();
  });

  it('continues a session at an earlier position (KV reuse) past the step it sent ahead', async () => {
    const direct = await open({});
    const ring = await open({ tokenPath: 'ring' });
    await generate(direct, 12);
    await generate(ring, 12);
    // both rewind to the prompt's end and take another turn
    for (const c of [direct, ring]) await c.rewind(PROMPT.length, { draws: 0 });
    const turn = async (c: RouteSessionClient): Promise<number[]> => {
      const out = [await c.prefill([9, 8, 7, 6])];
      for (let i = 0; i < 10; i++) out.push(await c.decode(out[out.length - 1]!));
      return out;
    };
    expect(await turn(ring)).toEqual(await turn(direct));
    await direct.close();
    await ring.close();
  });

  it('sends no step ahead past the session\'s context', async () => {
    const ctx = PROMPT.length + 6; // room for 6 decode steps
    const direct = await open({ contextLength: ctx });
    const ring = await open({ contextLength: ctx, tokenPath: 'ring' });
    expect(await generate(ring, 6)).toEqual(await generate(direct, 6));
    expect((await ring.info()).ring).toEqual({ sentAhead: 5, taken: 5, dropped: 0 });
    await direct.close();
    await ring.close();
  });

  it('goes on one-way, with the same tokens, when a ring token cannot reach stage 0 (RING_BROKEN)', async () => {
    const svc = last() as unknown as { opts: { ring: (f: unknown) => Promise<unknown> } };
    const ring0 = svc.opts.ring;
    last().setReturnTo((answer) => void route.manager.deliverReturn(answer), () => Promise.reject(new Error('the link to stage 0 broke')));
    try {
      const direct = await open({});
      const ring = await open({ tokenPath: 'ring' });
      expect(await generate(ring, 20)).toEqual(await generate(direct, 20));
      // the first step rang (and failed), the second found its step ahead broken and went one-way, as every step after it
      expect((await ring.info()).ring).toEqual({ sentAhead: 2, taken: 1, dropped: 0 });
      await direct.close();
      await ring.close();
    } finally {
      last().setReturnTo((answer) => void route.manager.deliverReturn(answer), ring0);
    }
  });

  it('leaves nothing waiting on stage 0 once a session that stopped with a step ahead closes', async () => {
    const ring = await open({ tokenPath: 'ring' });
    await generate(ring, 5);
    await ring.close(); // a step ahead was in flight or done: its wait and any early token go
    await new Promise((r) => setTimeout(r, 50));
    expect((route.services[0] as unknown as { inbox: RingInbox }).inbox.pending).toEqual({ steps: 0, tokens: 0 });
  });

  it('refuses ring tokens not meant for stage 0, naming what was wrong', async () => {
    const c = await open({});
    await c.prefill(PROMPT);
    const at = { routeId: route.route.id, sessionId: c.sessionId };
    const asked = (stage: number, f: ReturnType<typeof makeFrame>) => route.services[stage]!.handle(f).catch((e: MeshError) => e);
    expect(((await asked(1, ringTokenFrame(at, 10, 5, 0))) as MeshError).code).toBe('FRAME_BAD_TYPE');
    expect(((await asked(0, ringTokenFrame({ ...at, sessionId: newSessionId() }, 10, 5, 0))) as MeshError).code).toBe('SESSION_UNKNOWN');
    const bad = jsonFrame(FrameType.Status, at, { token: -3, generation: 0 }, ringTokenFrame(at, 10, 5, 0).flags);
    expect(((await asked(0, bad)) as MeshError).code).toBe('BAD_REQUEST');
    // a token of an older ring generation is answered, and not taken
    const stale = await route.services[0]!.handle(ringTokenFrame(at, 10, 5, 7));
    expect(JSON.parse(new TextDecoder().decode(stale.payload))).toMatchObject({ ringed: false });
    await c.close();
  });
});

describe('stage 0\'s ring inbox', () => {
  it('meets a step and its token in either order, drops a rewound session\'s, and keeps a bounded number of early tokens', async () => {
    const inbox = new RingInbox();
    const waiting = inbox.tokenFor('a', 4);
    inbox.arrived('a', 4, 77);
    expect(await waiting).toBe(77);
    inbox.arrived('a', 5, 78); // the token first
    expect(await inbox.tokenFor('a', 5)).toBe(78);
    expect(inbox.pending).toEqual({ steps: 0, tokens: 0 });
    const dropped = inbox.tokenFor('a', 9).catch((e: MeshError) => e.code);
    inbox.arrived('a', 12, 1);
    inbox.arrived('b', 12, 1);
    inbox.drop('a', 6, new MeshError('SESSION_REWOUND', 'rewound'));
    expect(await dropped).toBe('SESSION_REWOUND');
    expect(inbox.pending).toEqual({ steps: 0, tokens: 1 }); // b's stays
    for (let i = 0; i < 1000; i++) inbox.arrived('c', i, i);
    expect(inbox.pending.tokens).toBeLessThanOrEqual(256);
  });
});
