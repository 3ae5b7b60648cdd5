// The messages that used to kill or confuse `serve` (issue 16), sent to a real `gguf-mesh serve`
// process: text messages on a peer socket before and after authenticating, wrong-typed session
// open bodies on a client socket, and wrong-typed OpenAI request bodies. Each gets a 4xx-class
// named error; the process stays up and keeps answering.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { helloProof } from '../../src/protocol/control.ts';
import { FrameType } from '../../src/protocol/frame.ts';
import { encodeJson } from '../../src/protocol/payload.ts';
import { makeFrame } from '../../src/protocol/frame.ts';
import { newSessionId } from '../../src/protocol/session.ts';
import { WsLink } from '../../src/transport/ws.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import type { ServeInfo } from '../support/mesh.ts';
import { stories260K } from '../support/models.ts';
import { ODD_VALUES } from './fuzz-values.ts';

let s: ServeInfo;
let routeId: number;

beforeAll(async () => {
  s = await spawnServe(await stories260K());
  spawnMesh(['node', '--join', s.joinUrl, '--name', 'worker']);
  routeId = (await waitForRoute(s, 'ready')).id;
}, 90_000);

afterAll(() => killAll());

async function peerSocket(): Promise<{ ws: WebSocket; next: () => Promise<Record<string, any> | null> }> {
  const ws = new WebSocket(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/peer`);
  const inbox: Array<Record<string, any>> = [];
  ws.on('message', (d, bin) => !bin && inbox.push(JSON.parse(d.toString())));
  await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
  return {
    ws,
    async next() {
      for (let i = 0; i < 200 && !inbox.length && ws.readyState === ws.OPEN; i++) await new Promise((r) => setTimeout(r, 10));
      return inbox.shift() ?? null;
    },
  };
}

async function alive(): Promise<void> {
  expect(s.proc.child.exitCode).toBeNull();
  expect((await getJson(`${s.base}/v1/rooms/${s.roomId}`, s.secret)).status).toBe(200);
}

describe('messages that used to crash serve', () => {
  it.each([['{"t":"hello","proof":123}', 'proof'], ['null', ''], ['"hello"', ''], ['{"t":"hello","proof":"ab","units":5}', 'proof']])('before authenticating, %s is BAD_MESSAGE and serve lives', async (text, field) => {
    const p = await peerSocket();
    expect((await p.next())?.t).toBe('challenge');
    p.ws.send(text);
    const reply = await p.next();
    expect(reply).toMatchObject({ t: 'error', code: 'BAD_MESSAGE' });
    expect(reply!.message).toContain(field);
    await alive();
  });

  it('after authenticating, null and mistyped messages are answered with BAD_MESSAGE; the peer stays admitted', async () => {
    const p = await peerSocket();
    const challenge = await p.next();
    p.ws.send(JSON.stringify({ t: 'hello', proof: await helloProof(s.secret, challenge!.nonce), backend: 'cpu', memoryBytes: 1 }));
    expect((await p.next())?.t).toBe('welcome');
    for (const text of ['null', '{"t":"ready","routeId":"x","stage":{}}', '{"t":"relay","to":null}', '{"t":"signal","to":"a","cid":"b","signal":7}']) {
      p.ws.send(text);
      expect(await p.next(), text).toMatchObject({ t: 'error', code: 'BAD_MESSAGE' });
    }
    expect(p.ws.readyState).toBe(WebSocket.OPEN);
    await alive();
    p.ws.close();
  });

  it('session open bodies with a field mistyped are BAD_REQUEST naming it (400), on the client socket', async () => {
    const link = await WsLink.connect(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${s.secret}` } });
    const fields = ['contextLength', 'sampler', 'hiddenDtype', 'promptLength'];
    let refused = 0;
    for (const field of fields) {
      for (const odd of ODD_VALUES) {
        const body = { contextLength: 64, [field]: odd };
        const sessionId = newSessionId();
        const f = makeFrame({ type: FrameType.SessionOpen, routeId, sessionId, dtype: 4, payload: encodeJson(body) });
        const err = await link.request(f).then(() => null, (e: { code: string; message: string }) => e);
        if (err) {
          refused++;
          expect(err.code, `${field} = ${JSON.stringify(odd)}`).toBe('BAD_REQUEST');
          expect(err.message).toContain(field);
        } else await link.request(makeFrame({ type: FrameType.SessionClose, routeId, sessionId }));
      }
    }
    expect(refused).toBeGreaterThan(40);
    await link.close();
    await alive();
  });
});

describe('OpenAI request bodies', () => {
  const post = async (path: string, body: string): Promise<{ status: number; error: Record<string, any> }> => {
    const res = await fetch(`${s.base}${path}`, { method: 'POST', headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' }, body });
    const text = await res.text();
    // a streamed reply is SSE; an error one is JSON
    return { status: res.status, error: res.headers.get('content-type')?.startsWith('application/json') ? (JSON.parse(text) as { error: Record<string, any> }).error : {} };
  };

  it("the issue's bodies (null, messages: [null], content: 5) are 400 naming the field, not 500", async () => {
    expect(await post('/v1/chat/completions', 'null')).toMatchObject({ status: 400, error: { code: 'BAD_REQUEST' } });
    const nullMessage = await post('/v1/chat/completions', '{"messages":[null]}');
    expect(nullMessage).toMatchObject({ status: 400, error: { code: 'BAD_REQUEST', param: 'messages.0', type: 'invalid_request_error' } });
    const numberContent = await post('/v1/chat/completions', '{"messages":[{"role":"user","content":5}]}');
    expect(numberContent).toMatchObject({ status: 400, error: { code: 'BAD_REQUEST', param: 'messages.0.content' } });
  });

  it('every field of a completion mistyped gets a 4xx, never a 5xx', async () => {
    const base = { prompt: 'Once', max_tokens: 1, temperature: 0 };
    const fields = ['model', 'prompt', 'messages', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'seed', 'stop', 'stream', 'stream_options'];
    for (const field of fields) {
      for (const odd of ODD_VALUES) {
        const r = await post('/v1/completions', JSON.stringify({ ...base, [field]: odd }));
        expect(r.status, `${field} = ${JSON.stringify(odd)}`).toBeLessThan(500);
        if (r.status === 400 && r.error.code === 'BAD_REQUEST') expect(r.error.param, `${field} = ${JSON.stringify(odd)}`).toContain(field);
      }
    }
    await alive();
  });
});
