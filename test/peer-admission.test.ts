// Joining, both halves: the server's admission of a peer socket (signaling-server/
// peer-admission.ts: nothing but a verified hello is read before welcome) over a real server and
// real WebSockets, and the shared peer core (src/peer/peer-core.ts) — hello, assign, release, a
// load superseded or failed — with a stub backend as the environment's load. Also the API JSON
// reader every client shares (src/transport/server-json.ts) and its error codes.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { MeshError } from '../src/errors.ts';
import { PeerCore } from '../src/peer/peer-core.ts';
import type { Assignment, LoadContext, ShardLoad } from '../src/peer/peer-core.ts';
import { helloProof } from '../src/protocol/control.ts';
import type { PeerToServer } from '../src/protocol/control.ts';
import { FrameType, makeFrame, NIL_SESSION } from '../src/protocol/frame.ts';
import { decodeJson } from '../src/protocol/payload.ts';
import { fetchJson } from '../src/transport/server-json.ts';
import { startSignalingServer } from '../signaling-server/server.ts';
import type { SignalingServer } from '../signaling-server/server.ts';
import { stories260K } from './support/models.ts';
import { StubBackend } from './support/stub-backend.ts';

let server: SignalingServer;

beforeAll(async () => {
  // minPeers 2: the one peer a test admits is never assigned, so its socket sees only the join
  server = await startSignalingServer({ port: 0, models: [await stories260K()], minPeers: 2, planDelayMs: 50 });
}, 60_000);

afterAll(async () => {
  await server?.close();
});

/** A raw peer socket: every JSON message it receives, and how it closed. */
async function peerSocket(): Promise<{ ws: WebSocket; inbox: Array<Record<string, unknown>>; next: () => Promise<Record<string, unknown>>; closed: Promise<number> }> {
  const room = server.rooms[0]!;
  const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/v1/rooms/${room.id}/peer`);
  const inbox: Array<Record<string, unknown>> = [];
  const waiters: Array<(m: Record<string, unknown>) => void> = [];
  ws.on('message', (data, isBinary) => {
    if (isBinary) return;
    const m = JSON.parse(data.toString()) as Record<string, unknown>;
    const w = waiters.shift();
    if (w) w(m);
    else inbox.push(m);
  });
  const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
  const next = (): Promise<Record<string, unknown>> => (inbox.length ? Promise.resolve(inbox.shift()!) : new Promise((r) => waiters.push(r)));
  await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
  return { ws, inbox, next, closed };
}

const offer = { backend: 'stub', memoryBytes: 1 << 20 };

/** The socket got `{t:'error', code}`, was closed 4401, and no peer joined the room. */
async function expectRefused(p: Awaited<ReturnType<typeof peerSocket>>, code: string): Promise<void> {
  expect(await p.next()).toMatchObject({ t: 'error', code });
  expect(await p.closed).toBe(4401);
  expect(p.inbox.some((m) => m.t === 'welcome')).toBe(false);
  expect(server.rooms[0]!.peers.size).toBe(0);
}

/** A PeerCore joining the room over a real control socket, with `secret`. */
function coreJoining(secret: string, name: string): { core: PeerCore; joined: Promise<unknown>; gone: Promise<Error>; ws: WebSocket } {
  const room = server.rooms[0]!;
  const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/v1/rooms/${room.id}/peer`);
  const core = new PeerCore({ secret, send: (m) => ws.send(JSON.stringify(m)), log: () => undefined, loadShard: () => Promise.reject(new Error('not assigned here')), linkNext: async () => ({ link: null, detail: 'none' }) });
  ws.on('message', (d, bin) => !bin && core.onMessage(JSON.parse(d.toString())));
  const gone = new Promise<Error>((r) => ws.on('close', () => r(new MeshError('JOIN_FAILED', 'closed'))));
  return { core, joined: core.join({ ...offer, name }, gone), gone, ws };
}

describe('peer admission (server side)', () => {
  it('refuses any message before the hello with BAD_MESSAGE and closes 4401', async () => {
    const p = await peerSocket();
    expect((await p.next()).t).toBe('challenge');
    p.ws.send(JSON.stringify({ t: 'ready', routeId: 1, stage: 0, loadMs: 0, bytesRead: 0 }));
    await expectRefused(p, 'BAD_MESSAGE');
  });

  it('refuses a hello with a wrong proof: AUTH_FAILED', async () => {
    const p = await peerSocket();
    const { nonce } = (await p.next()) as { nonce: string };
    p.ws.send(JSON.stringify({ t: 'hello', proof: await helloProof('not the secret', nonce), ...offer }));
    await expectRefused(p, 'AUTH_FAILED');
  });

  it('reads nothing after the hello until its proof is verified: a second message is refused, the peer never admitted', async () => {
    const p = await peerSocket();
    const { nonce } = (await p.next()) as { nonce: string };
    const proof = await helloProof(server.rooms[0]!.secret, nonce);
    // both in one burst: the server is still verifying the first when the second arrives
    p.ws.send(JSON.stringify({ t: 'hello', proof, ...offer }));
    p.ws.send(JSON.stringify({ t: 'telemetry', routeId: 1, stage: 0 }));
    await expectRefused(p, 'BAD_MESSAGE');
  });

  it('admits a peer whose proof matches; it leaves the room when its socket closes', async () => {
    const p = await peerSocket();
    const { nonce } = (await p.next()) as { nonce: string };
    p.ws.send(JSON.stringify({ t: 'hello', proof: await helloProof(server.rooms[0]!.secret, nonce), name: 'raw', ...offer }));
    const welcome = await p.next();
    expect(welcome).toMatchObject({ t: 'welcome', roomId: server.rooms[0]!.id, model: { id: 'stories260K', nLayer: 5 } });
    expect(server.rooms[0]!.peers.get(String(welcome.peerId))?.hello).toMatchObject({ backend: 'stub', name: 'raw', proof: '' });
    p.ws.close();
    await p.closed;
    await expect.poll(() => server.rooms[0]!.peers.size).toBe(0);
  });
});

describe('PeerCore (the peer side every environment shares)', () => {
  it('joins a real server: the hello it sends on the challenge is admitted, and welcome names the peer', async () => {
    const { core, joined, gone, ws } = coreJoining(server.rooms[0]!.secret, 'core');
    expect(await joined).toMatchObject({ t: 'welcome', peerId: core.peerId });
    expect(server.rooms[0]!.peers.has(core.peerId!)).toBe(true);
    ws.close();
    await gone;
  });

  it('rejects the join with the server\'s code when the secret is wrong', async () => {
    await expect(coreJoining('wrong', 'core').joined).rejects.toMatchObject({ code: 'AUTH_FAILED' });
  });

  /** A core whose loads wait for `finish(i)` (or fail with `fail(i, e)`), recording what it sends and undoes. */
  function harness() {
    const sent: PeerToServer[] = [];
    const undone: string[] = [];
    const loads: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];
    const core = new PeerCore({
      secret: 's',
      send: (m) => sent.push(m),
      log: () => undefined,
      linkNext: async () => ({ link: null, detail: 'last stage' }),
      loadShard: async (ctx: LoadContext): Promise<ShardLoad> => {
        const a = ctx.assignment;
        const backend = ctx.keep(new StubBackend({ nLayer: 4, nEmbd: 8, nVocab: 16 }), async (b) => (undone.push(`backend ${a.routeId}`), b.dispose()));
        await backend.load(null, a.shard);
        await new Promise<void>((resolve, reject) => loads.push({ resolve, reject }));
        return { backend, bytesRead: 7, detail: 'test' };
      },
    });
    const assign = (routeId: number): Assignment => ({ t: 'assign', routeId, stage: 0, shard: { start: 0, end: 4 }, nLayer: 4, modelUrl: 'http://x/m.gguf', downstream: null });
    const settle = () => new Promise((r) => setTimeout(r, 10));
    /** a server message, then time for what it starts */
    const deliver = async (m: Parameters<PeerCore['onMessage']>[0]) => (core.onMessage(m), settle());
    return { core, sent, undone, loads, assign, settle, deliver };
  }

  it('assign → ready, frames served by the stage; release undoes what the load kept', async () => {
    const h = harness();
    await expect(h.core.handle(makeFrame({ type: FrameType.Status, sessionId: 'ab'.repeat(16) }))).rejects.toMatchObject({ code: 'STAGE_NOT_LOADED' });
    // a Status of no session is answered before there is a stage (another peer timing its link here)
    expect(decodeJson((await h.core.handle(makeFrame({ type: FrameType.Status, sessionId: NIL_SESSION }))).payload)).toEqual({ serving: false });
    await h.deliver(h.assign(1));
    h.loads[0]!.resolve();
    await h.settle();
    expect(h.sent).toEqual([expect.objectContaining({ t: 'ready', routeId: 1, stage: 0, bytesRead: 7 })]);
    expect(h.core.routeId).toBe(1);
    const status = await h.core.handle(makeFrame({ type: FrameType.Status, sessionId: NIL_SESSION }));
    expect(status.type).toBe(FrameType.Status);
    h.core.onMessage({ t: 'release', routeId: 2 }); // not this peer's route: ignored
    expect(h.core.service).not.toBeNull();
    await h.deliver({ t: 'release', routeId: 1 });
    expect(h.core.service).toBeNull();
    expect(h.undone).toEqual(['backend 1']);
  });

  it('a load released before it finishes is discarded: no ready, its backend disposed', async () => {
    const h = harness();
    await h.deliver(h.assign(1));
    h.core.onMessage({ t: 'release', routeId: 1 });
    h.loads[0]!.resolve();
    await h.settle();
    expect(h.sent).toEqual([]);
    expect(h.core.service).toBeNull();
    expect(h.undone).toEqual(['backend 1']);
  });

  it('a newer assignment supersedes a load in flight: only the newer one reports ready', async () => {
    const h = harness();
    await h.deliver(h.assign(1));
    await h.deliver(h.assign(2));
    h.loads[1]!.resolve();
    h.loads[0]!.resolve();
    await h.settle();
    expect(h.sent.map((m) => [m.t, (m as { routeId: number }).routeId])).toEqual([['ready', 2]]);
    expect(h.core.routeId).toBe(2);
    expect(h.undone).toEqual(['backend 1']);
  });

  it('a failed load reports load-failed with its code (LOAD_FAILED for a plain error) and undoes what it kept', async () => {
    const h = harness();
    await h.deliver(h.assign(1));
    h.loads[0]!.reject(new MeshError('TENSOR_HASH_MISMATCH', 'blk.2.attn_q.weight'));
    await h.settle();
    await h.deliver(h.assign(2));
    h.loads[1]!.reject(new Error('disk full'));
    await h.settle();
    expect(h.sent).toEqual([
      { t: 'load-failed', routeId: 1, stage: 0, code: 'TENSOR_HASH_MISMATCH', message: 'blk.2.attn_q.weight' },
      { t: 'load-failed', routeId: 2, stage: 0, code: 'LOAD_FAILED', message: 'disk full' },
    ]);
    expect(h.undone).toEqual(['backend 1', 'backend 2']);
  });
});

describe('fetchJson (the server API reader)', () => {
  it('a refusal carries the server\'s own code and the HTTP status', async () => {
    const room = server.rooms[0]!;
    const err = await fetchJson(`${server.url}/v1/rooms/${room.id}`, 'wrong').catch((e: MeshError) => e);
    expect(err).toMatchObject({ code: 'AUTH_FAILED', details: { status: 401 } });
    expect(await fetchJson<{ id: string }>(`${server.url}/v1/rooms/${room.id}`, room.secret)).toMatchObject({ id: room.id });
  });

  it('a reply without a mesh error body is HTTP_ERROR naming the URL and status', async () => {
    const plain = createServer((_req, res) => res.writeHead(502, { 'content-type': 'text/plain' }).end('bad gateway'));
    await new Promise<void>((r) => plain.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(plain.address() as AddressInfo).port}/v1/rooms/x`;
    try {
      const err = await fetchJson(url, 's').catch((e: MeshError) => e);
      expect(err).toMatchObject({ code: 'HTTP_ERROR', details: { status: 502 } });
      expect((err as Error).message).toContain(url);
    } finally {
      await new Promise((r) => plain.close(r));
    }
  });

  it('an unreachable server is JOIN_FAILED, or the code the caller names', async () => {
    const gone = createServer();
    await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(gone.address() as AddressInfo).port}/v1/rooms/x`;
    await new Promise((r) => gone.close(r));
    await expect(fetchJson(url, 's')).rejects.toMatchObject({ code: 'JOIN_FAILED' });
    await expect(fetchJson(url, 's', { unreachableCode: 'SERVER_UNREACHABLE' })).rejects.toMatchObject({ code: 'SERVER_UNREACHABLE' });
  });
});
