// What the server has measured of each peer's speed and link, for the planner that knows speed
// (plan-choice.ts), kept robust to a loaded machine:
// - its round trip: the least of its control socket's last RTT_WINDOW heartbeats (a load burst
//   on either end only ever adds time, and a mean jumped to 2-10 ms on a loaded machine whose
//   links were 0.3 ms; a link that really got longer shows once the window has passed it);
// - its decode cost per layer: the calibration at join (peer/calibrate.ts, in its hello), then —
//   once MIN_LIVE_STEPS have come — the median of its last LIVE_WINDOW live decode steps' own
//   compute, from the stage timings every single-token decode step carries back
//   (route/step-observer.ts; steps another session's step overlapped are left out: a stage may
//   have batched them), over the stage's layers and, on the last stage, the head in layers of
//   the same cost (plan-choice.ts headLayers, as the planner models it). A peer that calibrated
//   fast but steps slowly (throttled, another tab) is seen as it steps. Steps older than
//   LIVE_MAX_AGE_MS count no more: a peer left out for being slow is not slow forever (it has
//   no steps to show it recovered), its calibration speaks for it again.
// The prefill cost stays the calibration's: a pipelined prefill's chunks are answered before
// they are computed, so their timings do not come back whole.

import { median } from '../src/stats.ts';
import type { Peer } from './room-peer.ts';

/** Heartbeats whose least round trip is the peer's link figure (8 s at the default 500 ms). */
export const RTT_WINDOW = 16;
/** Live decode steps whose median is the peer's decode figure, and how many it takes to replace the calibration's. */
export const LIVE_WINDOW = 16;
export const MIN_LIVE_STEPS = 4;
export const LIVE_MAX_AGE_MS = 10 * 60_000;

/** The decode figure the planner reads for a peer, and where it came from (the peers API shows it as `speed`). */
export interface PlannedSpeed {
  decodeMsPerLayer: number;
  /** the calibration's (null: the peer did not calibrate) */
  prefillMsPerTokenLayer: number | null;
  source: 'calibration' | 'live';
  /** the calibration's decode figure, and the live one with the steps it is the median of */
  calibration: number | null;
  live: { decodeMsPerLayer: number; steps: number } | null;
}

/** A heartbeat's round trip (ms). */
export function notePong(peer: Peer, rttMs: number): void {
  const window = (peer.rttWindow ??= []);
  window.push(rttMs);
  if (window.length > RTT_WINDOW) window.shift();
  peer.rttMs = Math.min(...window);
}

/** One live decode step's own compute on `peer`'s stage, per layer (ms), at `at` (Date.now()). */
export function noteDecodeCost(peer: Peer, msPerLayer: number, at = Date.now()): void {
  if (!Number.isFinite(msPerLayer) || msPerLayer < 0) return;
  const window = (peer.liveDecode ??= []);
  window.push({ ms: msPerLayer, at });
  if (window.length > LIVE_WINDOW) window.shift();
}

/** The peer's decode figure: live once it has stepped MIN_LIVE_STEPS times (a peer that did not calibrate too), else its calibration's; undefined when it has neither. */
export function plannedSpeed(peer: Peer, now = Date.now()): PlannedSpeed | undefined {
  const cal = peer.hello.speed;
  const recent = (peer.liveDecode ?? []).filter((x) => now - x.at <= LIVE_MAX_AGE_MS).map((x) => x.ms);
  const steps = recent.length;
  const live = steps > 0 ? { decodeMsPerLayer: median(recent), steps } : null;
  const useLive = live !== null && steps >= MIN_LIVE_STEPS;
  if (!useLive && !cal) return undefined;
  return {
    decodeMsPerLayer: useLive ? live.decodeMsPerLayer : cal!.decodeMsPerLayer,
    prefillMsPerTokenLayer: cal?.prefillMsPerTokenLayer ?? null,
    source: useLive ? 'live' : 'calibration',
    calibration: cal?.decodeMsPerLayer ?? null,
    live,
  };
}
