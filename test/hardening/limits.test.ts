// Session and memory caps on real processes (serve + one cpu node on stories260K): a frame of
// too many tokens, sessions per client and per node, a context past the model's, direct node
// sessions that expire, and a fragment flood that announces 16 frames of 256 MiB — each a 4xx
// error naming the limit, nothing kept that was not asked for, RSS flat.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { FrameType, makeFrame } from '../../src/protocol/frame.ts';
import { jsonFrame, tokensFrame } from '../../src/protocol/payload.ts';
import { newSessionId } from '../../src/protocol/session.ts';
import { WsLink } from '../../src/transport/ws.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import type { ServeInfo } from '../support/mesh.ts';
import { stories260K } from '../support/models.ts';
import { floodFragments } from './fragment-flood.ts';

let s: ServeInfo;
let routeId: number;
let nodeUrl: string;

beforeAll(async () => {
  s = await spawnServe(await stories260K(), ['--max-sessions', '3']);
  spawnMesh(['node', '--join', s.joinUrl, '--max-sessions', '5', '--session-ttl', '2']);
  routeId = (await waitForRoute(s, 'ready')).id;
  nodeUrl = (await getJson(`${s.base}/v1/rooms/${s.roomId}/peers`, s.secret)).body.peers[0].httpUrl;
}, 90_000);

afterAll(() => killAll());

const client = (): Promise<WsLink> => WsLink.connect(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${s.secret}` } });
const open = (link: WsLink, contextLength = 64, sessionId = newSessionId()): Promise<string> => link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId }, { contextLength })).then(() => sessionId);
const refusal = (p: Promise<unknown>): Promise<{ code: string; message: string } | null> => p.then(() => null, (e: { code: string; message: string }) => e);
const nodeSessions = async (): Promise<number> => ((await getJson(`${nodeUrl}/v1/status`, s.secret)).body.sessions ?? []).length;
const rssMiB = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

describe('limits', () => {
  it('a Prefill frame of more than 512 tokens is FRAME_TOO_MANY_TOKENS; a context past the model is BAD_REQUEST', async () => {
    const link = await client();
    const sid = await open(link, 2048);
    const big = await refusal(link.request(tokensFrame(FrameType.Prefill, { routeId, sessionId: sid }, 0, Array.from({ length: 513 }, () => 5))));
    expect(big).toMatchObject({ code: 'FRAME_TOO_MANY_TOKENS' });
    expect(big!.message).toContain('512');
    expect(await refusal(open(link, 4096))).toMatchObject({ code: 'BAD_REQUEST', message: expect.stringContaining('2048') });
    // the session is unharmed and takes a frame of 512
    await link.request(tokensFrame(FrameType.Prefill, { routeId, sessionId: sid }, 0, Array.from({ length: 512 }, () => 5)));
    await link.close();
  });

  it('a client holds at most --max-sessions live sessions (429 SESSION_LIMIT), a node at most its own --max-sessions', async () => {
    const a = await client();
    const mine = [await open(a), await open(a), await open(a)];
    expect(await refusal(open(a))).toMatchObject({ code: 'SESSION_LIMIT' });
    const b = await client();
    await open(b);
    await open(b);
    expect(await nodeSessions()).toBe(5);
    const past = await refusal(open(b));
    expect(past).toMatchObject({ code: 'SESSION_LIMIT' });
    expect(past!.message).toContain('stage 0');
    // closing one frees a place
    await a.request(makeFrame({ type: FrameType.SessionClose, routeId, sessionId: mine[0]! }));
    await open(b);
    await a.close();
    await b.close();
    // a dropped socket's sessions are cancelled on the node too
    for (let i = 0; i < 50 && (await nodeSessions()) > 0; i++) await new Promise((r) => setTimeout(r, 100));
    expect(await nodeSessions()).toBe(0);
  });

  it('a session opened directly on a node expires after the node\'s --session-ttl', async () => {
    const direct = await WsLink.connect(`${nodeUrl.replace(/^http/, 'ws')}/v1/frames`, { headers: { authorization: `Bearer ${s.secret}` } });
    const sid = newSessionId();
    await direct.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: sid }, { contextLength: 64 }));
    expect(await nodeSessions()).toBe(1);
    const t0 = Date.now();
    while ((await nodeSessions()) > 0 && Date.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 200));
    expect(await nodeSessions()).toBe(0);
    expect(Date.now() - t0).toBeGreaterThan(1000);
    await direct.close();
  });

  it('16 fragments announcing 256 MiB frames are refused on the client socket; the server keeps nothing (RSS flat)', async () => {
    const pid = s.proc.child.pid!;
    const before = rssMiB(pid);
    const ws = new WebSocket(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${s.secret}` } });
    const codes: string[] = [];
    ws.on('message', (d: Buffer) => {
      const text = new TextDecoder().decode(d.subarray(52));
      codes.push((JSON.parse(text) as { code: string }).code);
    });
    await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
    floodFragments(ws);
    for (let i = 0; i < 100 && codes.length < 256; i++) await new Promise((r) => setTimeout(r, 50));
    expect(codes.length).toBe(256);
    expect(new Set(codes)).toEqual(new Set(['FRAGMENT_TOO_MANY', 'FRAGMENT_OUT_OF_ORDER']));
    expect(rssMiB(pid) - before).toBeLessThan(64);
    expect(ws.readyState).toBe(WebSocket.OPEN);
    ws.close();
  });
});
