// The WebRTC carrier in real Chromium: two simple-peer ends in one page, signalled directly,
// carry request frames one way and replies the other. Large frames are fragmented below the
// channel's message limit, decode-sized frames into small messages, counts are per channel.
import { afterAll, describe, expect, it } from 'vitest';
import { MeshError } from '../../src/errors.ts';
import { DType, FrameType } from '../../src/protocol/frame.ts';
import type { Frame } from '../../src/protocol/frame.ts';
import { decodeRows, hiddenFrame, replyAddress, tokensFrame } from '../../src/protocol/payload.ts';
import { connectDataChannel, MAX_DATA_CHANNEL_MESSAGE } from '../../src/transport/webrtc.ts';
import type { DataChannelPipe, SignalChannel } from '../../src/transport/webrtc.ts';
import { PipeLink, servePipe, SMALL_MESSAGE_BYTES } from '../../src/transport/webrtc-link.ts';

const SESSION = '0123456789abcdef0123456789abcdef';

/** Two signal channels wired to each other in this page. */
function signalPair(): [SignalChannel, SignalChannel] {
  const cbs: Array<((s: unknown) => void) | null> = [null, null];
  const queued: unknown[][] = [[], []];
  const end = (me: number): SignalChannel => ({
    send: (s) => {
      const other = 1 - me;
      const cb = cbs[other];
      if (cb) setTimeout(() => cb(s), 0);
      else queued[other]!.push(s);
    },
    onSignal: (cb) => {
      cbs[me] = cb;
      for (const s of queued[me]!.splice(0)) setTimeout(() => cb(s), 0);
    },
  });
  return [end(0), end(1)];
}

async function connectedPair(opts: { iceTransportPolicy?: RTCIceTransportPolicy; timeoutMs?: number } = {}): Promise<[DataChannelPipe, DataChannelPipe]> {
  const [sa, sb] = signalPair();
  return Promise.all([
    connectDataChannel({ initiator: true, signal: sa, label: 'b', ...opts }),
    connectDataChannel({ initiator: false, signal: sb, label: 'a', ...opts }),
  ]);
}

const pipes: DataChannelPipe[] = [];
afterAll(() => {
  for (const p of pipes) p.close();
});

describe('WebRTC data channel carrier (simple-peer)', () => {
  it('carries fragmented prefill-sized frames and small decode frames, counted per channel', async () => {
    const [a, b] = await connectedPair();
    pipes.push(a, b);
    expect(a.maxMessageSize).toBeLessThanOrEqual(MAX_DATA_CHANNEL_MESSAGE);
    expect(a.maxMessageSize).toBeGreaterThanOrEqual(64 * 1024);

    // downstream: doubles the hidden state it receives and answers with it
    const served = servePipe(b, async (f: Frame) => {
      const h = decodeRows(f.payload, f.dtype);
      for (let i = 0; i < h.length; i++) h[i]! *= 2;
      return hiddenFrame(replyAddress(f), f.position, h, f.nTokens, DType.F32);
    });
    const link = new PipeLink(a);

    const width = 512;
    const nTokens = 700; // 700 × 512 × 4 B = 1.4 MB: several 256 KiB messages
    const big = new Float32Array(nTokens * width).map((_, i) => (i % 977) / 7);
    const reply = await link.request(hiddenFrame({ routeId: 3, sessionId: SESSION }, 0, big, nTokens, DType.F32));
    expect(reply.type).toBe(FrameType.Hidden);
    expect(reply.nTokens).toBe(nTokens);
    const back = decodeRows(reply.payload, reply.dtype);
    expect(back[12345]).toBe(big[12345]! * 2);
    expect(back[nTokens * width - 1]).toBe(big[nTokens * width - 1]! * 2);
    const messagesForBig = link.counters.messagesSent;
    expect(messagesForBig).toBeGreaterThanOrEqual(Math.ceil((nTokens * width * 4) / a.maxMessageSize));
    expect(link.counters.largestMessage).toBeLessThanOrEqual(a.maxMessageSize);

    // decode-sized: one token of a 4096-wide model in f16 = 8 KiB + header → small messages
    const one = new Float32Array(4096).map((_, i) => i / 4096);
    const before = link.counters.messagesSent;
    const r1 = await link.request(hiddenFrame({ routeId: 3, sessionId: SESSION }, nTokens, one, 1, DType.F16));
    expect(decodeRows(r1.payload, r1.dtype)[4095]).toBeCloseTo((4095 / 4096) * 2, 2);
    expect(link.counters.messagesSent - before).toBe(Math.ceil((52 + 8192) / (SMALL_MESSAGE_BYTES - 20)));
    expect(served.largestMessage).toBeLessThanOrEqual(a.maxMessageSize);

    // round trips of one decode-sized frame (a 4096-wide f16 row), for the record
    const t0 = performance.now();
    for (let i = 0; i < 50; i++) await link.request(hiddenFrame({ routeId: 3, sessionId: SESSION }, nTokens + 1 + i, one, 1, DType.F16));
    console.log(`[timing] data channel round trip, 8 KiB decode frame each way: ${((performance.now() - t0) / 50).toFixed(2)} ms`);
    expect(link.counters.sentByType).toEqual({ Hidden: 52 });
    expect(served.receivedByType).toEqual({ Hidden: 52 });
    expect(served.sentByType).toEqual({ Hidden: 52 });
    expect(link.counters.receivedByType).toEqual({ Hidden: 52 });
  });

  it('waits on the channel buffer: a 20 MiB frame (past Chromium\'s 16 MiB send buffer) arrives intact', async () => {
    const [a, b] = await connectedPair();
    pipes.push(a, b);
    let got: Float32Array | null = null;
    servePipe(b, async (f: Frame) => {
      got = decodeRows(f.payload, f.dtype);
      return tokensFrame(FrameType.Token, replyAddress(f), f.position + f.nTokens, [1]);
    });
    const link = new PipeLink(a);
    const width = 2048;
    const nTokens = 2560; // 2560 × 2048 × 4 B = 20 MiB
    const big = new Float32Array(nTokens * width);
    for (let i = 0; i < big.length; i += 4099) big[i] = i;
    const t0 = performance.now();
    const reply = await link.request(hiddenFrame({ routeId: 3, sessionId: SESSION }, 0, big, nTokens, DType.F32));
    console.log(`[timing] 20 MiB frame over a data channel: ${(performance.now() - t0).toFixed(0)} ms (${(20 / ((performance.now() - t0) / 1000)).toFixed(1)} MiB/s)`);
    expect(reply.type).toBe(FrameType.Token);
    expect(got!.length).toBe(big.length);
    for (let i = 0; i < big.length; i += 4099) expect(got![i]).toBe(i);
  });

  it('turns a thrown handler error into an Error reply with its code', async () => {
    const [a, b] = await connectedPair();
    pipes.push(a, b);
    servePipe(b, async () => {
      throw new MeshError('POSITION_MISMATCH', 'expected position 4');
    });
    const link = new PipeLink(a);
    const err = await link.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: SESSION }, 3, [7])).catch((e: unknown) => e);
    expect((err as MeshError).code).toBe('POSITION_MISMATCH');
    // a frame the encoder refuses rejects the request; nothing is sent
    const sent = link.counters.messagesSent;
    const bad = await link.request({ ...tokensFrame(FrameType.Decode, { routeId: 1, sessionId: SESSION }, 3, [7]), nTokens: 2 }).catch((e: unknown) => e);
    expect((bad as MeshError).code).toBe('FRAME_BAD_DIMENSION');
    expect(link.counters.messagesSent).toBe(sent);
  });

  it('fails pending requests with LINK_CLOSED when the other side goes away', async () => {
    const [a, b] = await connectedPair();
    pipes.push(a);
    servePipe(b, () => new Promise<Frame>(() => {})); // never answers
    const link = new PipeLink(a);
    let closedWith: MeshError | null = null;
    link.onClose = (e) => (closedWith = e);
    const pending = link.request(tokensFrame(FrameType.Decode, { routeId: 1, sessionId: SESSION }, 0, [7])).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 50));
    b.close();
    const err = (await pending) as MeshError;
    expect(['LINK_CLOSED', 'LINK_FAILED']).toContain(err.code);
    expect(closedWith).not.toBeNull();
  });

  it('gives up with WEBRTC_TIMEOUT when no candidate pair can form', async () => {
    const [sa, sb] = signalPair();
    const opts = { iceTransportPolicy: 'relay' as const, timeoutMs: 1500 };
    const results = await Promise.allSettled([
      connectDataChannel({ initiator: true, signal: sa, label: 'b', ...opts }),
      connectDataChannel({ initiator: false, signal: sb, label: 'a', ...opts }),
    ]);
    for (const r of results) {
      expect(r.status).toBe('rejected');
      expect(((r as PromiseRejectedResult).reason as MeshError).code).toBe('WEBRTC_TIMEOUT');
    }
  });
});
