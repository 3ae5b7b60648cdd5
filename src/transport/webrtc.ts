// WebRTC data channels between two browser peers, over simple-peer. Offers, answers and ICE
// candidates travel through whatever signalling channel the caller provides (the signaling
// server's control socket). No STUN/TURN is needed on a LAN (host and mDNS candidates);
// internet peers pass `iceServers`. A connection that does not open within the timeout fails
// with WEBRTC_TIMEOUT, so the caller can fall back to relaying through the server.

import './webrtc-polyfills.ts'; // before simple-peer: it reads Buffer/process/global as it loads
import SimplePeer from 'simple-peer';
import type SimplePeerType from 'simple-peer';
import { MeshError } from '../errors.ts';
import type { MessagePipe } from './webrtc-link.ts';
import type { CandidatePair } from '../protocol/control.ts';

/** Chromium's SCTP maximum; a larger message is refused by the channel. */
export const MAX_DATA_CHANNEL_MESSAGE = 256 * 1024;
/** Pause sending while this many bytes wait in the channel's buffer (Chromium closes a channel
 *  whose buffer passes 16 MiB). */
const HIGH_WATER_BYTES = 4 * 1024 * 1024;
const LOW_WATER_BYTES = 1024 * 1024;

export interface SignalChannel {
  /** deliver one simple-peer signal object to the other side */
  send(signal: unknown): void;
  /** register the receiver of the other side's signals */
  onSignal(cb: (signal: unknown) => void): void;
}

export interface DataChannelOptions {
  /** the side that creates the offer (the upstream stage) */
  initiator: boolean;
  signal: SignalChannel;
  /** names the other side in errors and telemetry */
  label: string;
  iceServers?: RTCIceServer[];
  /** 'relay' admits only TURN candidates: with no TURN server nothing connects (tests use it to
   *  force the relay fallback the way a blocking network would) */
  iceTransportPolicy?: RTCIceTransportPolicy;
  /** give up after this long (ms, default 10 s) */
  timeoutMs?: number;
  /** a WebRTC implementation where the runtime has none (Node: ./webrtc-node.ts) */
  wrtc?: unknown;
}

/** What simple-peer keeps private but a flow-controlled sender needs. */
interface SimplePeerInternals {
  _channel?: RTCDataChannel | null;
  _pc?: RTCPeerConnection | null;
}

export interface DataChannelPipe extends MessagePipe {
  /** the simple-peer instance (for stats) */
  readonly peer: SimplePeerType.Instance;
  /** ms from creation to an open channel */
  readonly connectMs: number;
  /** the ICE candidate pair the connection selected (null when the stats do not say) */
  candidatePair(): Promise<CandidatePair | null>;
}

/** Reads the selected candidate pair from a peer connection's stats (the transport's, else the nominated succeeded pair). */
export async function selectedCandidatePair(pc: RTCPeerConnection): Promise<CandidatePair | null> {
  const stats = await pc.getStats();
  const all = new Map<string, Record<string, unknown>>();
  stats.forEach((r: Record<string, unknown>) => all.set(String(r.id), r));
  let pair: Record<string, unknown> | undefined;
  for (const r of all.values()) if (r.type === 'transport' && r.selectedCandidatePairId) pair = all.get(String(r.selectedCandidatePairId));
  pair ??= [...all.values()].find((r) => r.type === 'candidate-pair' && r.state === 'succeeded' && (r.nominated || r.selected));
  if (!pair) return null;
  const local = all.get(String(pair.localCandidateId));
  const remote = all.get(String(pair.remoteCandidateId));
  if (!local || !remote) return null;
  return {
    local: String(local.candidateType ?? 'unknown'),
    remote: String(remote.candidateType ?? 'unknown'),
    protocol: String(local.protocol ?? 'unknown'),
    ...(local.relayProtocol ? { relayProtocol: String(local.relayProtocol) } : {}),
    ...(typeof pair.currentRoundTripTime === 'number' && Number.isFinite(pair.currentRoundTripTime) ? { rttMs: Math.round(pair.currentRoundTripTime * 1e4) / 10 } : {}),
  };
}

/** Opens a data channel to the other side and resolves once it is open. */
export async function connectDataChannel(opts: DataChannelOptions): Promise<DataChannelPipe> {
  const t0 = performance.now();
  const config: RTCConfiguration = { iceServers: opts.iceServers ?? [] };
  if (opts.iceTransportPolicy) config.iceTransportPolicy = opts.iceTransportPolicy;
  const peer = new SimplePeer({ initiator: opts.initiator, trickle: true, config, ...(opts.wrtc ? { wrtc: opts.wrtc as SimplePeerType.Options['wrtc'] } : {}) });
  peer.on('signal', (s: unknown) => opts.signal.send(s));
  opts.signal.onSignal((s) => {
    if (!peer.destroyed) peer.signal(s as SimplePeerType.SignalData);
  });

  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      peer.destroy();
      reject(new MeshError('WEBRTC_TIMEOUT', `no data channel to ${opts.label} within ${opts.timeoutMs ?? 10_000} ms`, { peer: opts.label }));
    }, opts.timeoutMs ?? 10_000);
    peer.once('connect', () => {
      clearTimeout(timer);
      resolve();
    });
    peer.once('error', (e: Error & { code?: string }) => {
      clearTimeout(timer);
      reject(new MeshError('WEBRTC_FAILED', `data channel to ${opts.label} failed: ${e.code ?? ''} ${e.message}`, { peer: opts.label, cause: e.code }));
    });
  });
  return pipeOver(peer, opts.label, performance.now() - t0);
}

function pipeOver(peer: SimplePeerType.Instance, label: string, connectMs: number): DataChannelPipe {
  const internals = peer as unknown as SimplePeerInternals;
  const channel = internals._channel!;
  const sctpMax = internals._pc?.sctp?.maxMessageSize;
  const maxMessageSize = Math.min(sctpMax && Number.isFinite(sctpMax) && sctpMax > 0 ? sctpMax : MAX_DATA_CHANNEL_MESSAGE, MAX_DATA_CHANNEL_MESSAGE);
  channel.bufferedAmountLowThreshold = LOW_WATER_BYTES;
  const closeCbs: Array<(r: MeshError) => void> = [];
  let ended = false;
  const end = (reason: MeshError): void => {
    if (ended) return;
    ended = true;
    for (const cb of closeCbs) cb(reason);
  };
  peer.on('close', () => end(new MeshError('LINK_CLOSED', `data channel to ${label} closed`)));
  peer.on('error', (e: Error & { code?: string }) => end(new MeshError('LINK_FAILED', `data channel to ${label} failed: ${e.code ?? ''} ${e.message}`)));

  const drained = (): Promise<void> =>
    new Promise((resolve) => {
      const done = (): void => {
        channel.removeEventListener('bufferedamountlow', done);
        channel.removeEventListener('close', done);
        resolve();
      };
      channel.addEventListener('bufferedamountlow', done);
      channel.addEventListener('close', done);
    });

  return {
    label,
    peer,
    connectMs,
    maxMessageSize,
    candidatePair: () => (internals._pc ? selectedCandidatePair(internals._pc).catch(() => null) : Promise.resolve(null)),
    async send(message) {
      if (ended || peer.destroyed) throw new MeshError('LINK_CLOSED', `data channel to ${label} is closed`);
      while (channel.bufferedAmount > HIGH_WATER_BYTES && channel.readyState === 'open') await drained();
      if (message.byteLength > maxMessageSize) throw new MeshError('FRAGMENT_BAD_LIMIT', `message of ${message.byteLength} bytes exceeds the channel's ${maxMessageSize}`);
      peer.send(message);
    },
    onMessage(cb) {
      peer.on('data', (d: Uint8Array) => cb(new Uint8Array(d.buffer, d.byteOffset, d.byteLength)));
    },
    onClose(cb) {
      closeCbs.push(cb);
    },
    close() {
      peer.destroy();
      end(new MeshError('LINK_CLOSED', `data channel to ${label} closed`));
    },
  };
}
