// The links between a stage and its neighbours (browser tabs, and native nodes with WebRTC).
// Downstream: a WebRTC data channel to the next stage (this side offers), or — when none opens
// within the timeout, or the next stage is a native node without WebRTC — a relay through the
// signaling server. Upstream: previous stages
// offer channels; this side answers and serves their frames. Signals are keyed by sender and
// connection id (one per attempt), so a fresh offer never reaches an old channel.

import { MeshError } from '../errors.ts';
import { FrameType } from '../protocol/frame.ts';
import type { FrameHandler, FrameLink } from '../transport/link.ts';
import { connectDataChannel } from '../transport/webrtc.ts';
import type { DataChannelOptions, DataChannelPipe } from '../transport/webrtc.ts';
import { PipeLink, servePipe } from '../transport/webrtc-link.ts';
import type { PipeCounters } from '../protocol/control.ts';
import type { CandidatePair, HopKind, RelayReply, SignalFromPeer } from '../protocol/control.ts';
import { RelayLink } from './relay-link.ts';

export interface HopOptions {
  /** send a JSON control message to the server */
  sendJson: (m: unknown) => void;
  /** answers frames from upstream stages (this peer's stage); only Hidden frames reach it */
  handler: FrameHandler;
  /** whether to answer a data-channel offer from this peer (the assigned previous stage) */
  acceptFrom: (peerId: string) => boolean;
  iceServers?: RTCIceServer[];
  iceTransportPolicy?: RTCIceTransportPolicy;
  /** ms to wait for a data channel before relaying (default 10 s) */
  timeoutMs?: number;
  /** a WebRTC implementation where the runtime has none (native nodes: transport/webrtc-node.ts) */
  wrtc?: unknown;
  log: (line: string) => void;
}

export interface DownstreamHop {
  link: FrameLink | null;
  kind: HopKind;
  /** frames over the data channel (kind 'webrtc') */
  channel: PipeCounters | null;
  /** frames through the server (kind 'relay') */
  relayed: { frames: number; bytes: number } | null;
  /** the ICE candidate pair the data channel selected (kind 'webrtc') */
  candidatePair: CandidatePair | null;
}

export class Hops {
  /** frames over each upstream data channel, by `<peer>#<connection id>` */
  readonly upstreamChannels: Record<string, PipeCounters> = {};
  /** the candidate pair of each upstream data channel, by the same keys */
  readonly upstreamPairs: Record<string, CandidatePair | null> = {};
  private readonly sinks = new Map<string, (s: unknown) => void>();
  private readonly answering = new Map<string, Promise<DataChannelPipe | null>>();
  private readonly relays = new Set<RelayLink>();

  constructor(private readonly opts: HopOptions) {}

  /** ICE servers the signaling server announced (used unless the page configured its own). */
  useIceServers(servers: RTCIceServer[]): void {
    if (!this.opts.iceServers) this.opts.iceServers = servers;
  }

  private channelOptions(): Pick<DataChannelOptions, 'timeoutMs' | 'iceServers' | 'iceTransportPolicy' | 'wrtc'> {
    return {
      timeoutMs: this.opts.timeoutMs ?? 10_000,
      ...(this.opts.wrtc ? { wrtc: this.opts.wrtc } : {}),
      ...(this.opts.iceServers ? { iceServers: this.opts.iceServers } : {}),
      ...(this.opts.iceTransportPolicy ? { iceTransportPolicy: this.opts.iceTransportPolicy } : {}),
    };
  }

  /** A signal from another peer: to a channel being opened, or the first offer of a new one. */
  onSignal(m: SignalFromPeer): void {
    const key = `${m.from}#${m.cid}`;
    const sink = this.sinks.get(key);
    if (sink) sink(m.signal);
    else this.answer(m.from, String(m.cid), m.signal);
  }

  /** A relay reply from the server, to whichever relay link asked. */
  onRelayReply(m: RelayReply): void {
    for (const r of this.relays) if (r.deliver(m)) return;
  }

  /**
   * The link to the next stage: `null` on the last stage; a data channel to `next`; the server
   * relay when `relayOnly` (a native node without WebRTC) or after the channel timed out. A data
   * channel that closes later (the network dropped it) is replaced by the relay for the
   * frames that follow; `onChange` hears of the switch.
   */
  async connectDownstream(next: string | null, relayOnly: boolean, onChange: (hop: DownstreamHop) => void = () => {}): Promise<DownstreamHop> {
    if (!next) return { link: null, kind: 'none', channel: null, relayed: null, candidatePair: null };
    if (relayOnly) return this.relay(next);
    const cid = Math.random().toString(36).slice(2, 10);
    const key = `${next}#${cid}`;
    try {
      const pipe = await connectDataChannel({
        initiator: true,
        label: next,
        ...this.channelOptions(),
        signal: {
          send: (s) => this.opts.sendJson({ t: 'signal', to: next, cid, signal: s }),
          onSignal: (cb) => void this.sinks.set(key, cb),
        },
      });
      pipe.onClose(() => this.sinks.delete(key));
      const channel = new PipeLink(pipe);
      const candidatePair = await pipe.candidatePair();
      this.opts.log(`data channel to ${next} open (${Math.round(pipe.connectMs)} ms${candidatePair ? `, ${candidatePair.local}/${candidatePair.remote} ${candidatePair.protocol}` : ''})`);
      const link = new FailoverLink(channel, () => {
        const relayed = this.relay(next);
        this.opts.log(`data channel to ${next} closed; relaying through the server from now on`);
        onChange(relayed);
        return relayed.link!;
      });
      return { link, kind: 'webrtc', channel: channel.counters, relayed: null, candidatePair };
    } catch (e) {
      this.sinks.delete(key);
      this.opts.log(`no data channel to ${next} (${(e as MeshError).code ?? ''} ${(e as Error).message}); relaying through the server`);
      return this.relay(next);
    }
  }

  private relay(next: string): DownstreamHop {
    const link: RelayLink = new RelayLink(next, (m) => this.opts.sendJson(m), () => this.relays.delete(link));
    this.relays.add(link);
    return { link, kind: 'relay', channel: null, relayed: link.counters, candidatePair: null };
  }

  private answer(from: string, cid: string, first: unknown): void {
    const key = `${from}#${cid}`;
    if (this.answering.has(key)) return;
    if (!this.opts.acceptFrom(from)) {
      this.opts.log(`ignored a data channel offer from ${from}: not the previous stage`);
      return;
    }
    const pending: unknown[] = [first];
    this.sinks.set(key, (s) => pending.push(s));
    const forget = (): void => {
      this.answering.delete(key);
      this.sinks.delete(key);
    };
    const p = connectDataChannel({
      initiator: false,
      label: from,
      ...this.channelOptions(),
      signal: {
        send: (s) => this.opts.sendJson({ t: 'signal', to: from, cid, signal: s }),
        onSignal: (cb) => {
          this.sinks.set(key, cb);
          for (const s of pending.splice(0)) cb(s);
        },
      },
    }).then(
      (pipe) => {
        // a previous stage sends hidden states; session control comes from the server only
        this.upstreamChannels[key] = servePipe(pipe, async (f) => {
          if (f.type !== FrameType.Hidden) throw new MeshError('FRAME_BAD_TYPE', `frame type: a data channel from the previous stage carries Hidden frames, not ${FrameType[f.type]}`, { field: 'type' });
          return this.opts.handler(f);
        });
        this.opts.log(`data channel from ${from} open (${Math.round(pipe.connectMs)} ms)`);
        void pipe.candidatePair().then((p) => (this.upstreamPairs[key] = p));
        pipe.onClose(forget);
        return pipe;
      },
      (e: Error) => {
        this.opts.log(`data channel from ${from} did not open: ${e.message}`);
        forget();
        return null;
      },
    );
    this.answering.set(key, p);
  }

  /** Closes every upstream channel (the peer is leaving). */
  async close(): Promise<void> {
    for (const p of this.answering.values()) (await p)?.close();
    for (const r of [...this.relays]) await r.close();
  }
}

/** A data-channel link that, once the channel has closed, sends through a fallback (the relay).
 *  Requests in flight when it closes fail (LINK_CLOSED): their session decides what follows. */
class FailoverLink implements FrameLink {
  onClose?: (reason: MeshError) => void;
  private current: FrameLink;
  private closed = false;

  constructor(
    private readonly primary: PipeLink,
    fallback: () => FrameLink,
  ) {
    this.current = primary;
    primary.onClose = () => {
      if (!this.closed) this.current = fallback();
    };
  }

  get remote(): string {
    return this.current.remote;
  }

  get ordered(): boolean {
    return this.current.ordered === true;
  }

  request(frame: Parameters<FrameLink['request']>[0]): ReturnType<FrameLink['request']> {
    return this.current.request(frame);
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.current.close();
    if (this.current !== this.primary) await this.primary.close();
  }
}
