// A native stage serves hidden states over its listen address only from its current upstream:
// real loopback sockets (WebSocket and binary HTTP) into a frame server whose handler applies
// the stage's fence, as a native node wires it (peer/native-peer.ts). A connection declares its
// peer (`x-mesh-peer`) once, on its upgrade; a repair that names another upstream turns every
// other connection's frames away with NOT_UPSTREAM, naming the sender and the expected peer.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isMeshError } from '../src/errors.ts';
import type { MeshError } from '../src/errors.ts';
import { DType, encodeFrame, FrameType } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { hiddenFrame, jsonFrame, replyAddress, tokensFrame } from '../src/protocol/payload.ts';
import { newSessionId } from '../src/protocol/session.ts';
import { startFrameServer } from '../src/transport/frame-server.ts';
import { PEER_HEADER } from '../src/transport/link.ts';
import type { FrameServer } from '../src/transport/frame-server.ts';
import { HttpLink } from '../src/transport/http.ts';
import type { FrameLink } from '../src/transport/link.ts';
import { WsLink } from '../src/transport/ws.ts';
import { UpstreamFence } from '../src/peer/upstream-fence.ts';

const SECRET = 'fence-secret';
const session = newSessionId();
let server: FrameServer;
const fence = new UpstreamFence();
/** frames that got past the fence (what the stage would compute) */
const served: Frame[] = [];
const links: FrameLink[] = [];

const hidden = (position: number): Frame => hiddenFrame({ routeId: 1, sessionId: session }, position, new Float32Array(8).fill(position), 1, DType.F32);
const auth = (peer?: string): Record<string, string> => ({ authorization: `Bearer ${SECRET}`, ...(peer ? { [PEER_HEADER]: peer } : {}) });

async function ws(peer?: string): Promise<WsLink> {
  const l = await WsLink.connect(server.wsUrl, { headers: auth(peer) });
  links.push(l);
  return l;
}

async function refused(p: Promise<unknown>): Promise<MeshError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(isMeshError(e) ? e.code : String(e)).toBe('NOT_UPSTREAM');
  return e as MeshError;
}

beforeAll(async () => {
  server = await startFrameServer({
    host: '127.0.0.1',
    port: 0,
    secret: SECRET,
    handler: async (f, origin) => {
      fence.admit(f, origin);
      served.push(f);
      return jsonFrame(FrameType.Status, replyAddress(f), { position: f.position + f.nTokens });
    },
    status: () => ({ fence: fence.status() }),
  });
});

afterAll(async () => {
  for (const l of links) await l.close();
  await server.close();
});

describe('the upstream fence on a native stage', () => {
  it('serves the assigned upstream, refuses another declared peer with NOT_UPSTREAM naming both, and serves an undeclared connection while the upstream is the assigned one', async () => {
    fence.assigned('peer-a');
    const a = await ws('peer-a');
    const x = await ws('peer-x');
    const plain = await ws();
    await a.request(hidden(0));
    const e = await refused(x.request(hidden(1)));
    expect(e.message).toMatch(/Hidden frame .*position 1.* from peer peer-x refused: this stage's upstream is peer-a/);
    expect(e.details).toMatchObject({ from: 'peer-x', expected: 'peer-a' });
    // an older peer that names itself not: it can only be the assigned upstream
    await plain.request(hidden(1));
    expect(served.map((f) => f.position)).toEqual([0, 1]);
    expect(fence.status()).toMatchObject({ upstream: 'peer-a', rewired: false, refused: 1, lastRefused: { from: 'peer-x', expected: 'peer-a', type: 'Hidden', position: 1 } });
  });

  it('after a rewire to a new upstream: the old one, and undeclared hidden states, are refused on the connections they already hold; the server’s token frames still pass', async () => {
    served.length = 0;
    const a = await ws('peer-a');
    const b = await ws('peer-b');
    const plain = await ws();
    fence.moved('peer-b');
    const stale = await refused(a.request(hidden(2)));
    expect(stale.message).toMatch(/from peer peer-a refused: this stage's upstream is peer-b since a repair/);
    expect(stale.details).toMatchObject({ from: 'peer-a', expected: 'peer-b' });
    const undeclared = await refused(plain.request(hidden(2)));
    expect(undeclared.message).toMatch(/from a connection that named no peer refused/);
    await b.request(hidden(2));
    // the server's entry link names no peer and sends token ids (stage 0's input)
    await plain.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: session }, 3, [7]));
    expect(served.map((f) => [FrameType[f.type], f.position])).toEqual([['Hidden', 2], ['Decode', 3]]);
    // a rewire naming the same peer again changes nothing
    fence.moved('peer-b');
    await b.request(hidden(3));
  });

  it('binary HTTP carries the declaration per request: a stale peer gets a NOT_UPSTREAM Error frame with HTTP 409', async () => {
    fence.moved('peer-b');
    const stale = new HttpLink(server.url, auth('peer-a'));
    const e = await refused(stale.request(hidden(4)));
    expect(e.details).toMatchObject({ from: 'peer-a', expected: 'peer-b' });
    const res = await fetch(`${server.url}/v1/sessions/${session}/decode`, { method: 'POST', headers: { ...auth('peer-a'), 'content-type': 'application/octet-stream' }, body: encodeFrame(hidden(4)) });
    expect(res.status).toBe(409);
    await new HttpLink(server.url, auth('peer-b')).request(hidden(4));
    expect(served.at(-1)?.position).toBe(4);
  });

  it('a malformed declaration is refused before any frame: BAD_REQUEST over HTTP, the upgrade refused over WebSocket', async () => {
    const long = 'p'.repeat(65);
    const res = await fetch(`${server.url}/v1/status`, { headers: auth(long) });
    expect(res.status).toBe(200); // the status page takes no frames: no declaration is read
    const post = await fetch(`${server.url}/v1/sessions/${session}/decode`, { method: 'POST', headers: auth(long), body: new Uint8Array(0) });
    expect(post.status).toBe(400);
    expect(((await post.json()) as { error: { code: string } }).error.code).toBe('BAD_REQUEST');
    await expect(WsLink.connect(server.wsUrl, { headers: auth(long) })).rejects.toThrow(/HTTP 400/);
  });

  it('frames from the control socket carry no origin and are never fenced', () => {
    fence.moved('peer-b');
    expect(() => fence.admit(hidden(9), undefined)).not.toThrow();
  });
});
