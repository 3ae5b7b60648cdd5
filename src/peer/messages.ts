// The browser peer's additions to the peer control protocol (src/route/control.ts has the
// base: challenge, hello, welcome, assign, ready, release). All are JSON text messages on the
// peer's control WebSocket; the server routes them between peers of the same room.
//
//   peer → server  {t:'signal', to, cid, signal}       a simple-peer offer/answer/candidate for peer `to`
//   server → peer  {t:'signal', from, cid, signal}     (cid: one id per data channel attempt)
//   peer → server  {t:'relay', to, id, frame}          a request frame (base64) for peer `to`'s stage,
//   server → peer  {t:'relay-reply', id, frame|error}  used when no data channel could open
//   peer → server  {t:'telemetry', routeId, stage, …}  load progress, hop kind, frame counters
//
// hello gains `artifact` (sha256) and `units` (shard units held verified); assign gains
// `downstreamPeer` / `upstreamPeer` (peer ids of the neighbouring stages); welcome may carry
// `iceServers` (RTCIceServer[]) for peers that meet across the internet.

import type { PipeCounters } from '../transport/webrtc-link.ts';

export interface SignalToPeer {
  t: 'signal';
  to: string;
  /** connection id chosen by the offering side: one per data channel attempt */
  cid: string;
  signal: unknown;
}

export interface SignalFromPeer {
  t: 'signal';
  from: string;
  cid: string;
  signal: unknown;
}

export interface RelayRequest {
  t: 'relay';
  to: string;
  id: number;
  /** base64 of one encoded frame */
  frame: string;
}

export interface RelayReply {
  t: 'relay-reply';
  id: number;
  frame?: string;
  error?: { code: string; message: string };
}

/** How a stage reaches its next stage. */
export type HopKind = 'webrtc' | 'relay' | 'none';

export interface PeerTelemetry {
  t: 'telemetry';
  routeId: number;
  stage: number;
  phase: 'loading' | 'ready' | 'failed';
  load?: { doneBytes: number; totalBytes: number; fetchedBytes: number; cachedBytes: number };
  /** cached units reused / fetched, after loading */
  cache?: { hit: string[]; fetched: string[]; error: string | null };
  /** to the next stage */
  hop?: HopKind;
  /** frames over the data channel to the next stage (upstream side) */
  downstreamChannel?: PipeCounters | null;
  /** frames over data channels from previous stages (downstream side) */
  upstreamChannels?: Record<string, PipeCounters>;
  /** frames relayed through the server to the next stage */
  relayed?: { frames: number; bytes: number };
}

export function toBase64(bytes: Uint8Array): string {
  const B = (globalThis as { Buffer?: { from(b: Uint8Array): { toString(enc: string): string } } }).Buffer;
  if (B) return B.from(bytes).toString('base64');
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

export function fromBase64(text: string): Uint8Array {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
