// The browser peer's protocol pieces that run the same in Node: the relay (browser RelayLink →
// server relayThroughRoom → the target stage's link), signal forwarding, the HMAC proof
// (SubtleCrypto must equal the server's node:crypto), join-link parsing, and which model URLs
// get the room secret.
import { describe, expect, it } from 'vitest';
import { MeshError } from '../src/errors.ts';
import { DType, FrameType, makeFrame } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { decodeRows, hiddenFrame, replyAddress, tokensFrame } from '../src/protocol/payload.ts';
import { createHmac } from 'node:crypto';
import { helloProof, parseJoinUrl } from '../src/protocol/control.ts';
import { LocalLink } from '../src/transport/link.ts';
import type { FrameLink } from '../src/transport/link.ts';
import { modelHeaders } from '../src/peer/peer-core.ts';
import type { RelayReply, RelayRequest } from '../src/protocol/control.ts';
import { RelayLink } from '../src/peer/relay-link.ts';
import { handleBrowserPeerMessage } from '../signaling-server/browser-peers.ts';
import type { RelayLedger } from '../signaling-server/browser-peers.ts';

const SESSION = 'fedcba9876543210fedcba9876543210';

/** A room of two peers: 'up' (a browser without a channel) and 'down' (any stage). */
function room(downHandler: (f: Frame) => Promise<Frame>) {
  const links = new Map<string, FrameLink>([['down', new LocalLink(downHandler)]]);
  const inbox = new Map<string, unknown[]>();
  const ledger: RelayLedger = new Map();
  const view = {
    sendTo: (id: string, m: unknown) => {
      if (!['up', 'down'].includes(id)) return false;
      inbox.set(id, [...(inbox.get(id) ?? []), m]);
      return true;
    },
    controlOf: (id: string) => links.get(id) ?? null,
    nextStageOf: (id: string) => (id === 'up' ? 'down' : null), // the route: up → down
  };
  // the browser side: its RelayLink sends on "its control socket", the server answers
  const link = new RelayLink('down', (m: RelayRequest) => {
    handleBrowserPeerMessage(view, 'up', m, (reply) => link.deliver(reply as RelayReply), ledger);
  });
  return { link, ledger, inbox, view };
}

describe('relay through the server', () => {
  it('carries a request frame to the target stage and its reply back, counted on both sides', async () => {
    const { link, ledger } = room(async (f) => {
      const h = decodeRows(f.payload, f.dtype).map((x) => x + 1);
      return hiddenFrame(replyAddress(f), f.position, h, f.nTokens, DType.F32);
    });
    const h = new Float32Array(3 * 64).map((_, i) => i / 8);
    const reply = await link.request(hiddenFrame({ routeId: 7, sessionId: SESSION }, 4, h, 3, DType.F32));
    expect(reply.type).toBe(FrameType.Hidden);
    expect(reply.position).toBe(4);
    expect(decodeRows(reply.payload, reply.dtype)[100]).toBe(h[100]! + 1);
    await link.request(hiddenFrame({ routeId: 7, sessionId: SESSION }, 7, h.subarray(0, 64), 1, DType.F16));
    expect(link.counters.frames).toBe(2);
    expect(ledger.get('up->down')).toEqual({ frames: 2, bytes: link.counters.bytes });
  });

  it('passes the stage\'s error code back, and names a missing peer', async () => {
    const { link, view, ledger } = room(async () => {
      throw new MeshError('POSITION_MISMATCH', 'expected 3');
    });
    const hidden = hiddenFrame({ routeId: 1, sessionId: SESSION }, 9, new Float32Array(64), 1, DType.F16);
    const err = (await link.request(hidden).catch((e: unknown) => e)) as MeshError;
    expect(err.code).toBe('POSITION_MISMATCH');
    const lost = new RelayLink('gone', (m) => handleBrowserPeerMessage(view, 'up', m, (r) => lost.deliver(r as RelayReply), ledger));
    expect(((await lost.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: SESSION }, 0, [5])).catch((e: unknown) => e)) as MeshError).code).toBe('STAGE_UNREACHABLE');
    await lost.close();
    expect(((await lost.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: SESSION }, 0, [5])).catch((e: unknown) => e)) as MeshError).code).toBe('LINK_CLOSED');
  });

  it('relays only Hidden frames, and only from a stage to the next one', async () => {
    const { link, view, ledger } = room(async (f) => f);
    // a session frame through the relay would let one peer act on another's sessions
    const close = makeFrame({ type: FrameType.SessionClose, routeId: 1, sessionId: SESSION });
    expect(((await link.request(close).catch((e: unknown) => e)) as MeshError).code).toBe('RELAY_REFUSED');
    // the last stage sending "upstream"
    const back = new RelayLink('up', (m) => handleBrowserPeerMessage({ ...view, controlOf: () => new LocalLink(async (f) => f) }, 'down', m, (r) => back.deliver(r as RelayReply), ledger));
    const hidden = hiddenFrame({ routeId: 1, sessionId: SESSION }, 0, new Float32Array(64), 1, DType.F16);
    expect(((await back.request(hidden).catch((e: unknown) => e)) as MeshError).code).toBe('RELAY_REFUSED');
    expect(ledger.size).toBe(0); // nothing was relayed
  });

  it('forwards WebRTC signals to the named peer with the sender and connection id', () => {
    const { view, inbox } = room(async (f) => f);
    const handled = handleBrowserPeerMessage(view, 'up', { t: 'signal', to: 'down', cid: 'c1', signal: { type: 'offer', sdp: 'v=0' } } as never, () => undefined, new Map());
    expect(handled).toBe(true);
    expect(inbox.get('down')).toEqual([{ t: 'signal', from: 'up', cid: 'c1', signal: { type: 'offer', sdp: 'v=0' } }]);
    expect(handleBrowserPeerMessage(view, 'up', { t: 'ready' }, () => undefined, new Map())).toBe(false);
  });
});

describe('joining', () => {
  it('the hello proof is HMAC-SHA256(secret, nonce) in hex', async () => {
    expect(await helloProof('s3cret/+=', 'a1b2c3')).toBe(createHmac('sha256', 's3cret/+=').update('a1b2c3').digest('hex'));
  });

  it('parses room links; the secret stays in the fragment', () => {
    const p = parseJoinUrl('http://10.0.0.5:8080/room/ab12cd#secret=x%2By&other=1');
    expect(p).toMatchObject({ base: 'http://10.0.0.5:8080', roomId: 'ab12cd', secret: 'x+y' });
    expect(() => parseJoinUrl('http://h/rooms')).toThrow(expect.objectContaining({ code: 'BAD_JOIN_URL' }));
  });

  it('sends the room secret only to the signaling server\'s own model hosting', () => {
    expect(modelHeaders('http://127.0.0.1:9/models/m.gguf', 'http://127.0.0.1:9', 's', 'p1')).toEqual({ authorization: 'Bearer s', 'x-mesh-peer': 'p1' });
    expect(modelHeaders('https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf', 'http://127.0.0.1:9', 's', 'p1')).toEqual({});
  });
});
