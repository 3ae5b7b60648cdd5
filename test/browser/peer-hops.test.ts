// The links between two browser stages, in one Chromium page with real data channels: the
// upstream side offers, the downstream side answers and serves; signals and relayed frames go
// through an in-page stand-in for the signaling server (the same server-side code it runs).
// A channel that closes later is replaced by the relay for the frames that follow.
import { describe, expect, it } from 'vitest';
import { MeshError } from '../../src/errors.ts';
import { DType, FrameType } from '../../src/protocol/frame.ts';
import type { Frame } from '../../src/protocol/frame.ts';
import { decodeRows, hiddenFrame, replyAddress } from '../../src/protocol/payload.ts';
import { LocalLink } from '../../src/transport/link.ts';
import { Hops } from '../../src/peer/hops.ts';
import type { DownstreamHop } from '../../src/peer/hops.ts';
import type { RelayReply, SignalFromPeer } from '../../src/protocol/control.ts';
import { handleBrowserPeerMessage } from '../../signaling-server/browser-peers.ts';
import type { RelayLedger } from '../../signaling-server/browser-peers.ts';

const SESSION = '00112233445566778899aabbccddeeff';

/** Peers 'up' and 'down' and a server between them (signal forwarding, frame relay). */
function pair(opts: { iceTransportPolicy?: RTCIceTransportPolicy; accept?: (id: string) => boolean } = {}) {
  const { accept, ...channelOpts } = opts;
  const served: Frame[] = [];
  const handler = async (f: Frame): Promise<Frame> => {
    served.push(f);
    const h = decodeRows(f.payload, f.dtype).map((x) => -x);
    return hiddenFrame(replyAddress(f), f.position, h, f.nTokens, DType.F32);
  };
  const ledger: RelayLedger = new Map();
  const hops: Record<string, Hops> = {};
  const room = {
    sendTo: (id: string, m: unknown) => {
      const msg = m as { t: string };
      if (msg.t === 'signal') setTimeout(() => hops[id]!.onSignal(m as SignalFromPeer), 0);
      if (msg.t === 'relay-reply') setTimeout(() => hops[id]!.onRelayReply(m as RelayReply), 0);
      return id in hops;
    },
    controlOf: (id: string) => (id === 'down' ? new LocalLink(handler) : null), // the stage's control socket
    nextStageOf: (id: string) => (id === 'up' ? 'down' : null),
  };
  const make = (me: string): Hops =>
    new Hops({
      sendJson: (m) => handleBrowserPeerMessage(room, me, m as { t: string }, (r) => room.sendTo(me, r), ledger),
      handler,
      acceptFrom: accept ?? ((id) => id === 'up'),
      timeoutMs: 1500,
      ...channelOpts,
      log: () => undefined,
    });
  hops.up = make('up');
  hops.down = make('down');
  return { up: hops.up, down: hops.down, served, ledger };
}

const one = (position: number): Frame => hiddenFrame({ routeId: 2, sessionId: SESSION }, position, new Float32Array(64).fill(position + 1), 1, DType.F16);

describe('Hops between two browser stages', () => {
  it('connects a data channel, then relays once the channel closes', async () => {
    const { up, down, served, ledger } = pair();
    const changes: DownstreamHop[] = [];
    const hop = await up.connectDownstream('down', false, (h) => changes.push(h));
    expect(hop.kind).toBe('webrtc');
    const r0 = await hop.link!.request(one(0));
    expect(decodeRows(r0.payload, r0.dtype)[0]).toBe(-1);
    expect(hop.channel!.sentByType.Hidden).toBe(1);
    expect(Object.values(down.upstreamChannels)[0]!.receivedByType.Hidden).toBe(1);
    expect(ledger.size).toBe(0);

    await down.close(); // the downstream side's channel goes away (as when the network drops it)
    for (let i = 0; i < 50 && !changes.length; i++) await new Promise((r) => setTimeout(r, 50));
    expect(changes.map((c) => c.kind)).toEqual(['relay']);
    const r1 = await hop.link!.request(one(1));
    expect(decodeRows(r1.payload, r1.dtype)[0]).toBe(-2);
    expect(ledger.get('up->down')?.frames).toBe(1);
    expect(served.map((f) => f.position)).toEqual([0, 1]);
    await hop.link!.close();
    await expect(hop.link!.request(one(2))).rejects.toMatchObject({ code: 'LINK_CLOSED' });
  });

  it('answers only the previous stage, and serves it Hidden frames only', async () => {
    const { up, served } = pair();
    const hop = await up.connectDownstream('down', false);
    const close = { ...one(0), type: FrameType.SessionClose, dtype: DType.None, width: 0, nTokens: 0, payload: new Uint8Array(0) };
    await expect(hop.link!.request(close)).rejects.toMatchObject({ code: 'FRAME_BAD_TYPE' });
    expect(served).toHaveLength(0);
    await hop.link!.close();
  });

  it('a peer that is not the previous stage gets no channel (its offer is ignored)', async () => {
    const { up, ledger } = pair({ accept: () => false });
    const hop = await up.connectDownstream('down', false); // times out, then relays: the server checks the route
    expect(hop.kind).toBe('relay');
    expect((await hop.link!.request(one(0))).type).toBe(FrameType.Hidden);
    expect(ledger.get('up->down')?.frames).toBe(1);
  });

  it('relays from the start when no channel opens in time; the last stage has no hop', async () => {
    const { up, ledger } = pair({ iceTransportPolicy: 'relay' });
    const hop = await up.connectDownstream('down', false);
    expect(hop.kind).toBe('relay');
    const r = await hop.link!.request(one(0));
    expect(r.type).toBe(FrameType.Hidden);
    expect(ledger.get('up->down')?.frames).toBe(1);
    expect(await up.connectDownstream(null, false)).toMatchObject({ kind: 'none', link: null });
  });

  it('a native next stage is reached through the relay without trying a channel', async () => {
    const { up } = pair();
    const t0 = performance.now();
    const hop = await up.connectDownstream('down', true);
    expect(hop.kind).toBe('relay');
    expect(performance.now() - t0).toBeLessThan(100);
    const err = await hop.link!.request({ ...one(0), type: 99 as FrameType }).catch((e: unknown) => e);
    expect((err as MeshError).code).toBe('FRAME_BAD_TYPE'); // refused before it leaves
    expect((await hop.link!.request(one(0))).type).toBe(FrameType.Hidden);
  });
});
