// WebRTC for a native node's stage: the same Hops a browser stage uses (./hops.ts), over
// @roamhq/wrtc. A previous stage that is a tab offers a data channel and this node answers it;
// a next stage that is a tab gets a data channel offered from here — so a tab ↔ native hop goes
// peer to peer, not as two legs through the server (the relay stays the fallback). Hops to
// other native nodes keep their WebSocket to the listen address.

import type { FrameHandler } from '../transport/link.ts';
import { loadNodeWebRtc } from '../transport/webrtc-node.ts';
import type { HopKind, IceServer, PeerTelemetry, RelayReply, SignalFromPeer } from '../protocol/control.ts';
import type { CandidatePair } from '../protocol/control.ts';
import { Hops } from './hops.ts';
import type { DownstreamHop } from './hops.ts';

export interface NativeRtcOptions {
  /** a JSON control message to the server */
  sendJson: (m: unknown) => void;
  /** this node's stage (frames from an upstream data channel; only Hidden frames reach it) */
  handler: FrameHandler;
  /** ms to wait for a data channel before relaying (default 10 s) */
  timeoutMs?: number;
  log: (line: string) => void;
}

export class NativeRtc {
  private upstreamPeer: string | null = null;
  private report: { routeId: number; stage: number; hop: HopKind; candidatePair: CandidatePair | null } | null = null;
  private lastSent = '';
  private readonly timer: NodeJS.Timeout;

  private constructor(
    private readonly hops: Hops,
    private readonly opts: NativeRtcOptions,
  ) {
    // upstream pairs become known after the previous stage's offer: report them as they appear
    this.timer = setInterval(() => this.sendTelemetry(), 1000);
    this.timer.unref();
  }

  /** WebRTC for this node, or null (logged) where @roamhq/wrtc does not load: hops then relay. */
  static async start(opts: NativeRtcOptions): Promise<NativeRtc | null> {
    const rtc = await loadNodeWebRtc();
    if ('error' in rtc) {
      opts.log(`no WebRTC: ${rtc.error}; hops to tabs go through the server relay`);
      return null;
    }
    let self: NativeRtc | null = null;
    const hops = new Hops({
      sendJson: opts.sendJson,
      handler: opts.handler,
      acceptFrom: (id) => id === self?.upstreamPeer,
      wrtc: rtc.wrtc,
      ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}),
      log: opts.log,
    });
    self = new NativeRtc(hops, opts);
    return self;
  }

  /** The server's STUN/TURN servers (its welcome). */
  useIceServers(servers: IceServer[]): void {
    this.hops.useIceServers(servers as RTCIceServer[]);
  }

  /** The previous stage of the current assignment: the only peer whose offer is answered. */
  setUpstream(peerId: string | null): void {
    this.upstreamPeer = peerId;
  }

  /** Control messages for WebRTC (signals, relay replies); false for any other. */
  onControl(m: { t: string }): boolean {
    if (m.t === 'signal') this.hops.onSignal(m as SignalFromPeer);
    else if (m.t === 'relay-reply') this.hops.onRelayReply(m as RelayReply);
    else return false;
    return true;
  }

  /** A data channel to the tab serving the next stage (the relay when none opens). */
  connectDownstream(next: string): Promise<DownstreamHop> {
    return this.hops.connectDownstream(next, false);
  }

  /** What the room's route summary shows for this stage: its hop, and the candidate pairs. */
  serving(routeId: number, stage: number, hop: HopKind, candidatePair: CandidatePair | null): void {
    this.report = { routeId, stage, hop, candidatePair };
    this.sendTelemetry();
  }

  released(): void {
    this.report = null;
    this.lastSent = '';
  }

  private sendTelemetry(): void {
    if (!this.report) return;
    const t: PeerTelemetry = { t: 'telemetry', phase: 'ready', ...this.report, upstreamPairs: { ...this.hops.upstreamPairs }, upstreamChannels: this.hops.upstreamChannels };
    const text = JSON.stringify(t);
    if (text === this.lastSent) return;
    this.lastSent = text;
    this.opts.sendJson(t);
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    await this.hops.close();
  }
}
