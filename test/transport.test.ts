// The stub route: three stub stages over real loopback sockets prove prefill chunks, decode
// steps, KV bookkeeping, the HTTP session paths, fragmentation and failure handling without a
// model. A one-stage stub over all layers is the reference the route must equal exactly.
import { afterAll, describe, expect, it } from 'vitest';
import { StubBackend } from './support/stub-backend.ts';
import type { StubModel } from './support/stub-backend.ts';
import { startLoopbackRoute } from '../src/peer/loopback.ts';
import type { LoopbackRoute } from '../src/peer/loopback.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { newSessionId } from '../src/protocol/session.ts';
import { encodeFrame, FrameFlag, FrameType, makeFrame } from '../src/protocol/frame.ts';
import { decodeI32, decodeJson, jsonFrame, tokensFrame } from '../src/protocol/payload.ts';
import { HttpLink } from '../src/transport/http.ts';
import { WsLink } from '../src/transport/ws.ts';
import { isMeshError, MeshError } from '../src/errors.ts';

const MODEL: StubModel = { nLayer: 6, nEmbd: 16, nVocab: 50 };
const PROMPT = [3, 17, 5, 42, 8, 1, 9, 30, 2, 11];
const open: LoopbackRoute[] = [];

async function stubRoute(ranges: Array<[number, number]>, opts: Partial<Parameters<typeof startLoopbackRoute>[1]> = {}): Promise<LoopbackRoute> {
  const stages = [];
  for (const [start, end] of ranges) {
    const backend = new StubBackend(MODEL);
    await backend.load(null, { start, end });
    stages.push({ backend, shard: { start, end } });
  }
  const r = await startLoopbackRoute(stages, { nLayer: MODEL.nLayer, ...opts });
  open.push(r);
  return r;
}

async function generate(r: LoopbackRoute, n: number, hiddenDtype: 'f16' | 'f32', chunk = 4): Promise<{ tokens: number[]; client: RouteSessionClient }> {
  const client = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64, hiddenDtype });
  const tokens = [await client.prefill(PROMPT, chunk)];
  while (tokens.length < n) tokens.push(await client.decode(tokens.at(-1)!));
  return { tokens, client };
}

async function expectRejects(p: Promise<unknown>, code: string): Promise<MeshError> {
  try {
    await p;
  } catch (e) {
    expect(isMeshError(e) ? e.code : String(e)).toBe(code);
    return e as MeshError;
  }
  throw new Error(`expected ${code}, resolved`);
}

afterAll(async () => {
  for (const r of open) await r.close();
});

describe('stub route over loopback sockets', () => {
  it('three stages over WebSocket give exactly the one-stage tokens (f32 hidden states)', async () => {
    const single = await stubRoute([[0, 6]], { carrier: 'local' });
    const chain = await stubRoute([[0, 2], [2, 5], [5, 6]]);
    const ref = await generate(single, 12, 'f32');
    const got = await generate(chain, 12, 'f32');
    expect(got.tokens).toEqual(ref.tokens);
    expect(new Set(ref.tokens).size).toBeGreaterThan(1); // the stub is not constant
    // no recompute: every layer of every stage processed prompt + fed-back tokens, once
    const info = await got.client.info();
    expect(info.position).toBe(PROMPT.length + 11);
    expect(info.state).toBe('idle');
    for (const st of info.stages) {
      expect(st.processedTokens as number[]).toEqual(new Array((st.shard as { end: number; start: number }).end - (st.shard as { start: number }).start).fill(PROMPT.length + 11));
      expect(st.kvBytes).toBeGreaterThan(0);
    }
    await got.client.close();
    const after = await got.client.info();
    expect(after.state).toBe('closed');
    for (const st of after.stages) expect(st.kvBytes).toBe(0);
    for (const svc of chain.services) expect(svc.openSessions).toBe(0);
    await ref.client.close();
  });

  it('every stage reports its part of each step; the reply carries the breakdown back to the client', async () => {
    const chain = await stubRoute([[0, 2], [2, 4], [4, 6]]);
    const c = await RouteSessionClient.open(chain.clientLink, chain.route.id, { contextLength: 64 });
    c.wantTimings = true;
    const t = await c.prefill(PROMPT, 64);
    expect(c.lastTimings.map((x) => x.stage)).toEqual([0, 1, 2]);
    expect(c.lastTimings.every((x) => x.position === 0 && x.handleUs >= x.computeUs)).toBe(true);
    await c.decode(t);
    const [s0, s1, s2] = c.lastTimings;
    expect(s0!.position).toBe(PROMPT.length);
    expect(s0!.bytesIn).toBe(0);
    expect(s0!.bytesOut).toBe(52 + MODEL.nEmbd * 2); // one f16 row plus the header
    expect(s1!.bytesIn).toBe(s0!.bytesOut);
    expect(s2!.bytesOut).toBe(0);
    expect(s0!.downstreamUs).toBeGreaterThanOrEqual(s1!.handleUs);
    await c.close();
  });

  it('one-way token path: the last stage hands every sampled token to the session manager; the same tokens as the climbing path', async () => {
    const climbing = await stubRoute([[0, 2], [2, 4], [4, 6]], { directReturn: false });
    const oneWay = await stubRoute([[0, 2], [2, 4], [4, 6]]);
    const ref = await generate(climbing, 12, 'f16');
    const got = await generate(oneWay, 12, 'f16');
    expect(got.tokens).toEqual(ref.tokens);
    expect(climbing.services[2]!.tokensReturned).toBe(0);
    expect(oneWay.services[2]!.tokensReturned).toBe(12); // the prefill's sampled chunk and 11 decode steps
    // timings rode forward with the hidden states and reach the client whole, with each hop's share filled in
    got.client.wantTimings = true;
    await got.client.decode(got.tokens.at(-1)!);
    const [s0, s1, s2] = got.client.lastTimings;
    expect(got.client.lastTimings.map((x) => x.stage)).toEqual([0, 1, 2]);
    expect(s1!.bytesIn).toBe(s0!.bytesOut);
    expect(s0!.downstreamUs).toBeGreaterThanOrEqual(s1!.handleUs);
    expect(s1!.downstreamUs).toBeGreaterThanOrEqual(s2!.handleUs);
    expect(s2!.handleUs).toBeGreaterThanOrEqual(s2!.computeUs);
    const info = await got.client.info();
    expect(info.position).toBe(PROMPT.length + 12);
    await got.client.close();
    await ref.client.close();
  });

  it('one-way token path with chunked stages: a prompt frame computed in 3-token chunks answers the same token and log-probabilities, one-way', async () => {
    const ref = await stubRoute([[0, 2], [2, 4], [4, 6]], { directReturn: false });
    const chunked = await stubRoute([[0, 2], [2, 4], [4, 6]], { stageLimits: { chunkTokens: 3 } });
    const run = async (r: LoopbackRoute) => {
      const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64, logprobs: 3 });
      c.wantTimings = true;
      const tokens = [await c.prefill(PROMPT, 64)]; // one 10-token frame: chunks of 3, 3, 3, 1 on every stage
      const logprobs = [c.lastLogprob];
      const timings = c.lastTimings.map((t) => t.stage);
      for (let i = 0; i < 3; i++) (tokens.push(await c.decode(tokens.at(-1)!)), logprobs.push(c.lastLogprob));
      const info = await c.info();
      await c.close();
      return { tokens, logprobs, timings, position: info.position };
    };
    const want = await run(ref);
    const got = await run(chunked);
    expect(got.tokens).toEqual(want.tokens);
    expect(got.logprobs).toEqual(want.logprobs);
    expect(got.logprobs[0]!.top).toHaveLength(3);
    expect(got.timings).toEqual([0, 1, 2]);
    expect(got.position).toBe(PROMPT.length + 3);
    expect(chunked.services[2]!.tokensReturned).toBe(4); // the chunked prefill's token one-way too
    expect(ref.services[2]!.tokensReturned).toBe(0);
  });

  it('one-way token path: a stage failing mid-step still fails the step naming it', async () => {
    const r = await stubRoute([[0, 2], [2, 4], [4, 6]]);
    const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    const t = await c.prefill(PROMPT, 64);
    await r.servers[2]!.close(); // the last stage is gone: its hop breaks, no token comes
    const err = await expectRejects(c.decode(t), 'STAGE_UNREACHABLE');
    expect(err.details?.stage).toBe(2);
  });

  it('concurrent sessions on one route keep separate KV caches', async () => {
    const single = await stubRoute([[0, 6]], { carrier: 'local' });
    const chain = await stubRoute([[0, 2], [2, 4], [4, 6]]);
    const ref = await generate(single, 10, 'f32');
    const runs = await Promise.all([0, 1, 2, 3].map(() => generate(chain, 10, 'f32', 3)));
    for (const r of runs) expect(r.tokens).toEqual(ref.tokens);
    expect(chain.services[1]!.openSessions).toBe(4);
    await Promise.all(runs.map((r) => r.client.close()));
    expect(chain.services.map((s) => s.openSessions)).toEqual([0, 0, 0]);
  });

  it('f16 hidden states travel at 2 bytes per value and stay close to f32', async () => {
    const chain = await stubRoute([[0, 3], [3, 6]]);
    const c = await RouteSessionClient.open(chain.clientLink, chain.route.id, { contextLength: 64, hiddenDtype: 'f16' });
    await c.prefill(PROMPT, 64);
    // 10 tokens × 16 values × 2 bytes
    expect(chain.services[0]!.bytesOut).toBe(PROMPT.length * MODEL.nEmbd * 2);
    await c.close();
  });

  it('the same route over binary HTTP, prompt in 3-token chunks', async () => {
    const single = await stubRoute([[0, 6]], { carrier: 'local' });
    const chain = await stubRoute([[0, 1], [1, 4], [4, 6]], { carrier: 'http' });
    expect((await generate(chain, 8, 'f32', 3)).tokens).toEqual((await generate(single, 8, 'f32', 3)).tokens);
  });

  for (const limit of [16 * 1024, 256 * 1024]) {
    it(`fragments frames to ${limit / 1024} KiB messages between stages`, async () => {
      const wide: StubModel = { nLayer: 2, nEmbd: 1024, nVocab: 50 };
      const stages = [];
      for (const [start, end] of [[0, 1], [1, 2]] as const) {
        const b = new StubBackend(wide);
        await b.load(null, { start, end });
        stages.push({ backend: b, shard: { start, end } });
      }
      const r = await startLoopbackRoute(stages, { nLayer: 2, messageLimit: limit });
      open.push(r);
      const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 512, hiddenDtype: 'f32' });
      const prompt = Array.from({ length: 300 }, (_, i) => i % 50);
      const tok = await c.prefill(prompt, 300); // 300 × 1024 × 4 = 1.2 MB in one frame
      expect(tok).toBeGreaterThanOrEqual(0);
      expect(r.services[0]!.bytesOut).toBe(300 * 1024 * 4);
      await c.close();
    });
  }
});

describe('lifetimes', () => {
  it('closing a route leaves no session, pending request or connection behind', async () => {
    const r = await stubRoute([[0, 3], [3, 6]]);
    const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    await c.prefill(PROMPT);
    expect(r.servers.map((s) => s.connections.size)).toEqual([3, 2]); // control, entry and the last stage's ring link on stage 0; control + downstream on stage 1
    await r.close();
    expect(r.manager.liveCount()).toBe(0);
    expect(r.services.map((s) => s.openSessions)).toEqual([0, 0]);
    expect(r.servers.map((s) => s.connections.size)).toEqual([0, 0]);
    expect((r.route.entry() as WsLink).inFlight).toBe(0);
  });
});

describe('session rules', () => {
  it('refuses out-of-order positions, decode before prefill, unknown sessions and steps after close', async () => {
    const r = await stubRoute([[0, 3], [3, 6]]);
    const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    const at = { routeId: r.route.id, sessionId: c.sessionId };
    await expectRejects(r.clientLink.request(tokensFrame(FrameType.Decode, at, 0, [1])), 'SESSION_BAD_STATE');
    await c.prefill([1, 2, 3]);
    const e = await expectRejects(r.clientLink.request(tokensFrame(FrameType.Decode, at, 7, [1])), 'POSITION_MISMATCH');
    expect(e.details).toMatchObject({ expected: 3, got: 7 });
    expect(r.manager.state(c.sessionId)).toBe('idle'); // a refused frame changes nothing
    const unknown = await expectRejects(r.clientLink.request(tokensFrame(FrameType.Decode, { ...at, sessionId: newSessionId() }, 0, [1])), 'SESSION_UNKNOWN');
    expect(unknown.details?.field).toBe('session id');
    await expectRejects(r.clientLink.request(tokensFrame(FrameType.Decode, { ...at, routeId: 99 }, 3, [1])), 'FRAME_BAD_ROUTE');
    await expectRejects(RouteSessionClient.open(r.clientLink, 99, { contextLength: 8 }), 'ROUTE_UNKNOWN');
    await c.close();
    await expectRejects(c.decode(4), 'SESSION_CLOSED');
  });

  it('prefill chunks are pipelined; a stage lost under a pipelined chunk fails the session naming it', async () => {
    const r = await stubRoute([[0, 2], [2, 4], [4, 6]]);
    const ok = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    await ok.prefill(PROMPT, 2);
    // every stage saw every chunk, in order, once
    const info = await ok.info();
    for (const st of info.stages) expect((st.processedTokens as number[])[0]).toBe(PROMPT.length);
    await ok.close();
    const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    await r.killStage(2);
    const e = await expectRejects(c.prefill(PROMPT, 3), 'STAGE_UNREACHABLE');
    expect(e.details?.stage).toBe(2);
    expect(r.manager.state(c.sessionId)).toBe('failed');
    expect(r.services[0]!.openSessions + r.services[1]!.openSessions).toBe(0);
  });

  it('expires an idle session after its TTL and frees every stage', async () => {
    const r = await stubRoute([[0, 2], [2, 6]], { sessions: { idleTtlMs: 150, sweepMs: 25 } });
    const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    await c.prefill(PROMPT);
    await new Promise((res) => setTimeout(res, 400));
    const info = await c.info();
    expect(info.state).toBe('expired');
    expect(info.history).toEqual(['opening', 'idle', 'prefilling', 'idle', 'expired']);
    for (const st of info.stages) expect(st.kvBytes).toBe(0);
    await expectRejects(c.decode(1), 'SESSION_CLOSED');
  });

  it('a stage that dies mid-session fails the session naming it and frees the others', async () => {
    const r = await stubRoute([[0, 2], [2, 4], [4, 6]]);
    const c = await RouteSessionClient.open(r.clientLink, r.route.id, { contextLength: 64 });
    const t = await c.prefill(PROMPT);
    await r.killStage(1);
    const e = await expectRejects(c.decode(t), 'STAGE_UNREACHABLE');
    expect(e.details?.stage).toBe(1);
    const info = await c.info();
    expect(info.state).toBe('failed');
    expect(info.failure?.stage).toBe(1);
    expect(r.services[0]!.openSessions).toBe(0);
    expect(r.services[2]!.openSessions).toBe(0);
    expect(info.stages[1]!.reachable).toBe(false);
  });
});

describe('binary HTTP on one stage node', () => {
  it('serves open, prefill, decode, status and delete, and refuses bad input with typed errors', async () => {
    const r = await stubRoute([[0, 6]]);
    const base = r.servers[0]!.url;
    const auth = { authorization: `Bearer ${r.secret}` };
    const sid = newSessionId();
    const link = new HttpLink(base, auth);
    await link.request(jsonFrame(FrameType.SessionOpen, { routeId: 1, sessionId: sid }, { contextLength: 32 }));
    const t1 = await link.request(tokensFrame(FrameType.Prefill, { routeId: 1, sessionId: sid }, 0, [1, 2, 3], FrameFlag.Sample));
    expect(t1.type).toBe(FrameType.Token);
    const t2 = await link.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: sid }, 3, [decodeI32(t1.payload)[0]!]));
    expect(t2.type).toBe(FrameType.Token);
    expect(t2.position).toBe(4);

    const status = await fetch(`${base}/v1/sessions/${sid}`, { headers: auth });
    expect(await status.json()).toMatchObject({ open: true, position: 4, processedTokens: new Array(6).fill(4) });
    const nodeStatus = (await (await fetch(`${base}/v1/status`, { headers: auth })).json()) as { sessions: unknown[] };
    expect(nodeStatus.sessions).toHaveLength(1);

    // out-of-order position → 409 with an Error frame
    const bad = await fetch(`${base}/v1/sessions/${sid}/decode`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: sid }, 9, [1])) });
    expect(bad.status).toBe(409);
    await expectRejects(link.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: sid }, 9, [1])), 'POSITION_MISMATCH');
    // malformed body → 400 naming the field
    const garbage = await fetch(`${base}/v1/sessions/${sid}/decode`, { method: 'POST', headers: auth, body: new Uint8Array(60) });
    expect(garbage.status).toBe(400);
    const gf = decodeJson<{ code: string; message: string }>(new Uint8Array(await garbage.arrayBuffer()).subarray(52));
    expect(gf.code).toBe('FRAME_BAD_MAGIC');
    // a frame for another session than the path names
    const other = await fetch(`${base}/v1/sessions/${sid}/decode`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: newSessionId() }, 4, [1])) });
    expect(other.status).toBe(400);
    // a decode frame on the prefill path's opposite: a Hidden-only path refuses token frames? (prefill accepts Prefill)
    const wrongType = await fetch(`${base}/v1/sessions/${sid}/prefill`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: sid }, 4, [1])) });
    expect(wrongType.status).toBe(400);
    // wrong secret → 401, unknown session → 404
    expect((await fetch(`${base}/v1/status`, { headers: { authorization: 'Bearer nope' } })).status).toBe(401);
    expect((await fetch(`${base}/v1/status`)).status).toBe(401);
    await expectRejects(new HttpLink(base, { authorization: 'Bearer nope' }).request(makeFrame({ type: FrameType.SessionClose, sessionId: sid })), 'AUTH_FAILED');
    await expectRejects(link.request(makeFrame({ type: FrameType.SessionClose, sessionId: newSessionId() })), 'SESSION_UNKNOWN');

    await link.request(makeFrame({ type: FrameType.SessionClose, sessionId: sid }));
    expect(r.services[0]!.openSessions).toBe(0);
    expect(await (await fetch(`${base}/v1/sessions/${sid}`, { headers: auth })).json()).toMatchObject({ open: false, kvBytes: 0 });
  });

  it('refuses a WebSocket without the secret and answers garbage messages with an error frame', async () => {
    const r = await stubRoute([[0, 6]]);
    await expectRejects(WsLink.connect(r.servers[0]!.wsUrl, { headers: { authorization: 'Bearer wrong' } }), 'AUTH_FAILED');
    const { default: WebSocket } = await import('ws');
    const ws = new WebSocket(r.servers[0]!.wsUrl, { headers: { authorization: `Bearer ${r.secret}` } });
    await new Promise((res) => ws.once('open', res));
    const reply = await new Promise<Buffer>((res) => {
      ws.once('message', (d) => res(d as Buffer));
      ws.send(Buffer.from('not a frame at all, just bytes'), { binary: true });
    });
    const body = decodeJson<{ code: string }>(new Uint8Array(reply).subarray(52));
    expect(body.code).toBe('FRAME_BAD_MAGIC');
    // the socket still works afterwards
    const link = WsLink.wrap(ws, 'raw');
    const st = await link.request(makeFrame({ type: FrameType.Status }));
    expect(decodeJson<{ stage: number }>(st.payload).stage).toBe(0);
    await link.close();
  });
});
