// The schema-driven fuzzer over every control message (src/protocol/control.ts): each message
// type with every field mistyped, missing and extra, and whole-message garbage, sent to a real
// signaling server over real sockets — before authentication (the hello) and after (everything
// a peer may send). Each bad message gets BAD_MESSAGE naming the field, a good one is taken,
// and the server still admits and serves peers afterwards. The peer side parses every message
// the server may send with the same schemas: a bad one is BAD_MESSAGE, never a TypeError.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { MeshError } from '../../src/errors.ts';
import { helloProof, parseServerMessage, PEER_MESSAGES, SERVER_MESSAGES } from '../../src/protocol/control.ts';
import { startSignalingServer } from '../../signaling-server/server.ts';
import type { SignalingServer } from '../../signaling-server/server.ts';
import { stories260K } from '../support/models.ts';
import { GARBAGE, variantsOf } from './fuzz-values.ts';

let server: SignalingServer;

beforeAll(async () => {
  server = await startSignalingServer({ port: 0, models: [await stories260K()], minPeers: 99, planDelayMs: 50 });
}, 60_000);

afterAll(async () => {
  await server?.close();
});

interface Sock {
  ws: WebSocket;
  next(ms?: number): Promise<Record<string, any> | null>;
  closed: Promise<number>;
}

async function socket(): Promise<Sock> {
  const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/v1/rooms/${server.rooms[0]!.id}/peer`);
  const inbox: Array<Record<string, any>> = [];
  const waiters: Array<(m: Record<string, any>) => void> = [];
  ws.on('message', (d, bin) => {
    if (bin) return;
    const m = JSON.parse(d.toString()) as Record<string, any>;
    const w = waiters.shift();
    if (w) w(m);
    else inbox.push(m);
  });
  const closed = new Promise<number>((r) => ws.on('close', (c) => r(c)));
  await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
  return {
    ws,
    closed,
    next: (ms = 5000) =>
      inbox.length
        ? Promise.resolve(inbox.shift()!)
        : new Promise((resolve) => {
            const timer = setTimeout(() => resolve(null), ms);
            waiters.push((m) => (clearTimeout(timer), resolve(m)));
            void closed.then(() => (clearTimeout(timer), resolve(null)));
          }),
  };
}

const SECRET = (): string => server.rooms[0]!.secret;

/** A valid message of every type a peer sends (the hello's proof is filled in per socket). */
function fixtures(): Record<keyof typeof PEER_MESSAGES, Record<string, unknown>> {
  return {
    hello: { t: 'hello', proof: '0'.repeat(64), name: 'fz', backend: 'cpu', memoryBytes: 1 << 20, listen: 'ws://127.0.0.1:9/v1/frames', httpUrl: 'http://127.0.0.1:9', layers: { start: 0, end: 1 }, artifact: 'a'.repeat(64), units: ['embed', 'layer.0'], adapter: { vendor: 'x', features: ['f'] }, serves: { rangeArchitectures: ['llama'], wholeModelArchitectures: ['*'], weightTypes: ['F32', 'Q8_0'] }, rtc: true, directReturn: true, speed: { decodeMsPerLayer: 0.5, prefillMsPerTokenLayer: 0.1, source: 'calibration' }, probesLinks: true },
    ready: { t: 'ready', routeId: 7, stage: 0, loadMs: 1.5, bytesRead: 10 },
    'load-failed': { t: 'load-failed', routeId: 7, stage: 0, code: 'LOAD_FAILED', message: 'no' },
    loading: { t: 'loading', routeId: 7, stage: 0, bytesDone: 1, bytesTotal: 2 },
    telemetry: { t: 'telemetry', routeId: 7, stage: 0, phase: 'ready', hop: 'webrtc', relayed: { frames: 1, bytes: 2 }, candidatePair: { local: 'host', remote: 'srflx', protocol: 'udp' }, upstreamPairs: { 'p-2': { local: 'relay', remote: 'host', protocol: 'udp', relayProtocol: 'tcp' } } },
    'standby-ready': { t: 'standby-ready', routeId: 7, stage: 1, loadMs: 3, bytesRead: 10 },
    'standby-failed': { t: 'standby-failed', routeId: 7, stage: 1, code: 'LOAD_FAILED', message: 'no' },
    rewired: { t: 'rewired', routeId: 7, stage: 1 },
    leave: { t: 'leave' },
    return: { t: 'return', routeId: 7, stage: 0, frame: 'R01TSA==' },
    memory: { t: 'memory', memoryBytes: 1 << 20, code: 'OUT_OF_MEMORY', message: 'no', routeId: 7, stage: 0 },
    'links-probed': { t: 'links-probed', id: 1, results: [{ peer: 'p-2', rttMs: 0.4 }, { peer: 'p-3', error: 'refused' }] },
    signal: { t: 'signal', to: 'nobody', cid: 'c1', signal: { type: 'offer', sdp: 'v=0' } },
    relay: { t: 'relay', to: 'nobody', id: 1, frame: 'R01TSA==' },
    check: { t: 'check', routeId: 7, sessionId: 'ab'.repeat(16), position: 0, nTokens: 1, role: 'actual', row: 'AACAPw==' },
  };
}

async function admitted(name: string): Promise<Sock> {
  const s = await socket();
  const challenge = await s.next();
  s.ws.send(JSON.stringify({ t: 'hello', proof: await helloProof(SECRET(), challenge!.nonce), backend: 'cpu', memoryBytes: 1 << 20, name }));
  expect((await s.next())?.t).toBe('welcome');
  return s;
}

/**
 * Sends `text`, then a sentinel the server refuses: every error before the sentinel's answers
 * `text` (a relay's reply comes later, asynchronously: it is left out).
 */
async function exchange(s: Sock, text: string): Promise<Array<Record<string, any>>> {
  s.ws.send(text);
  s.ws.send(JSON.stringify({ t: 'sentinel' }));
  const replies: Array<Record<string, any>> = [];
  for (;;) {
    const m = await s.next();
    if (!m) throw new Error(`no answer to ${text.slice(0, 120)}`);
    if (m.t === 'error' && /sentinel/.test(m.message)) return replies;
    if (m.t !== 'relay-reply') replies.push(m);
  }
}

describe('control messages: schema-driven fuzzing of a real server', () => {
  it('before authentication: every variant of the hello and any garbage is refused with a named error and closed 4401, or admitted when valid', async () => {
    const variants = variantsOf(PEER_MESSAGES.hello, fixtures().hello).filter((x) => x.field !== 'proof');
    expect(variants.length).toBeGreaterThan(100);
    let admittedCount = 0;
    for (const variant of [...variants, ...GARBAGE.map((g) => ({ label: JSON.stringify(g), message: g, field: null, valid: false }))]) {
      const s = await socket();
      const challenge = await s.next();
      const msg = variant.message as Record<string, unknown> | null;
      // a valid variant carries the right proof; the variant under test is the other fields
      const sent = msg && typeof msg === 'object' && !Array.isArray(msg) && msg.t === 'hello' ? { ...msg, proof: await helloProof(SECRET(), challenge!.nonce) } : msg;
      s.ws.send(JSON.stringify(sent));
      const reply = await s.next();
      if (variant.valid) {
        expect(reply?.t, variant.label).toBe('welcome');
        admittedCount++;
        s.ws.close();
      } else {
        expect(reply, variant.label).toMatchObject({ t: 'error', code: 'BAD_MESSAGE' });
        if (variant.field) expect(reply!.message, variant.label).toContain(variant.field);
        expect(await s.closed).toBe(4401);
      }
    }
    expect(admittedCount).toBeGreaterThan(10);
  });

  it('after authentication: every field of every message type mistyped, missing or extra gets BAD_MESSAGE naming it, a valid one is taken, and the socket stays open', async () => {
    const s = await admitted('fuzzer');
    const peer = [...server.rooms[0]!.peers.values()].find((p) => p.hello.name === 'fuzzer')!;
    let refused = 0;
    for (const [t, schema] of Object.entries(PEER_MESSAGES)) {
      if (t === 'hello') continue; // after welcome a hello is refused whatever it holds
      for (const variant of variantsOf(schema, fixtures()[t as keyof typeof PEER_MESSAGES])) {
        const replies = await exchange(s, JSON.stringify(variant.message));
        const errors = replies.filter((r) => r.t === 'error');
        if (variant.valid) {
          expect(errors, `${t}: ${variant.label}`).toEqual([]);
        } else {
          refused++;
          expect(errors, `${t}: ${variant.label}`).toHaveLength(1);
          expect(errors[0]!.code).toBe('BAD_MESSAGE');
          expect(errors[0]!.message, `${t}: ${variant.label}`).toContain(variant.field === 't' ? 'type' : variant.field!);
        }
      }
    }
    for (const g of GARBAGE) expect((await exchange(s, JSON.stringify(g))).map((r) => r.code), JSON.stringify(g)).toEqual(['BAD_MESSAGE']);
    for (const raw of ['', 'nul', '{"t":"ready"', '{"t":"telemetry","routeId":1,"stage":0,"phase":"ready","__proto__":{"polluted":1}}', '[]'.repeat(10_000)]) {
      const codes = (await exchange(s, raw)).map((r) => r.code);
      expect(codes.every((c) => c === 'BAD_MESSAGE'), raw.slice(0, 40)).toBe(true);
    }
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(refused).toBeGreaterThan(200);
    expect(s.ws.readyState).toBe(WebSocket.OPEN);
    // what the room kept of the peer is its hello's known fields
    expect(Object.keys(peer.hello).sort()).toEqual(['backend', 'memoryBytes', 'name', 'proof', 't']);
    s.ws.close();
    // and the server still admits peers and answers the API
    const again = await admitted('after-fuzz');
    again.ws.close();
    const res = await fetch(`${server.url}/v1/rooms/${server.rooms[0]!.id}`, { headers: { authorization: `Bearer ${SECRET()}` } });
    expect(res.status).toBe(200);
  });
});

describe('control messages: what a peer reads from the server', () => {
  const valid: Record<keyof typeof SERVER_MESSAGES, Record<string, unknown>> = {
    challenge: { t: 'challenge', nonce: 'ab'.repeat(16) },
    welcome: { t: 'welcome', peerId: 'p-1', roomId: 'r', model: { id: 'm', url: 'http://127.0.0.1:1/models/m.gguf', nLayer: 5, fileBytes: 10, files: 1 }, iceServers: [{ urls: 'stun:127.0.0.1:3478' }] },
    assign: { t: 'assign', routeId: 1, stage: 0, shard: { start: 0, end: 5 }, nLayer: 5, modelUrl: 'http://127.0.0.1:1/models/m.gguf', downstream: null, downstreamPeer: null, upstreamPeer: null, downstreamRtc: true },
    release: { t: 'release', routeId: 1 },
    standby: { t: 'standby', routeId: 1, stage: 1, shard: { start: 2, end: 5 }, nLayer: 5, modelUrl: 'https://127.0.0.1:1/models/m.gguf' },
    rewire: { t: 'rewire', routeId: 1, stage: 0, downstream: 'wss://127.0.0.1:9/v1/frames', downstreamPeer: 'p-3', downstreamRtc: false, upstreamPeer: null },
    'leave-ok': { t: 'leave-ok', moved: true },
    'probe-links': { t: 'probe-links', id: 1, targets: [{ peer: 'p-2', url: 'ws://127.0.0.1:9/v1/frames' }] },
    watch: { t: 'watch', routeId: 1, sessionId: 'cd'.repeat(16) },
    error: { t: 'error', code: 'AUTH_FAILED', message: 'no' },
    signal: { t: 'signal', from: 'p-2', cid: 'c', signal: { type: 'answer', sdp: 'v=0' } },
    'relay-reply': { t: 'relay-reply', id: 1, error: { code: 'RELAY_FAILED', message: 'x' } },
  };

  it('parses every variant of every server message into the schema or a BAD_MESSAGE naming the field, never anything else', () => {
    let refused = 0;
    for (const [t, schema] of Object.entries(SERVER_MESSAGES)) {
      for (const variant of variantsOf(schema, valid[t as keyof typeof SERVER_MESSAGES])) {
        let err: unknown = null;
        try {
          parseServerMessage(JSON.stringify(variant.message));
        } catch (e) {
          err = e;
        }
        if (variant.valid) expect(err, `${t}: ${variant.label}`).toBeNull();
        else {
          refused++;
          expect(err, `${t}: ${variant.label}`).toBeInstanceOf(MeshError);
          expect((err as MeshError).code).toBe('BAD_MESSAGE');
        }
      }
    }
    for (const g of GARBAGE) expect(() => parseServerMessage(JSON.stringify(g))).toThrow(expect.objectContaining({ code: 'BAD_MESSAGE' }));
    expect(refused).toBeGreaterThan(150);
  });
});
