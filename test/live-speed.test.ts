// What the server measures of a peer for the planner that knows speed (signaling-server/
// live-speed.ts): its round trip, the least of its recent heartbeats (a load burst does not
// move it; a link that really got longer does, once the window passed it), and its decode
// figure, the calibration's until enough live steps came, then their median.
import { describe, expect, it } from 'vitest';
import { LIVE_MAX_AGE_MS, LIVE_WINDOW, MIN_LIVE_STEPS, noteDecodeCost, notePong, plannedSpeed, RTT_WINDOW } from '../signaling-server/live-speed.ts';
import type { Peer } from '../signaling-server/room-peer.ts';

const peer = (speed?: { decodeMsPerLayer: number; prefillMsPerTokenLayer: number }): Peer => ({ id: 'p', hello: speed ? { speed: { ...speed, source: 'calibration' } } : {} }) as unknown as Peer;

describe('a peer round trip', () => {
  it('is the least of the recent heartbeats: a burst does not raise it, a longer link does', () => {
    const p = peer();
    for (const ms of [0.4, 0.3, 0.5]) notePong(p, ms);
    expect(p.rttMs).toBe(0.3);
    for (const ms of [6, 9, 4]) notePong(p, ms); // a loaded machine for a moment
    expect(p.rttMs).toBe(0.3);
    for (let i = 0; i < RTT_WINDOW; i++) notePong(p, 40 + (i % 3));
    expect(p.rttMs).toBe(40);
  });
});

describe('a peer decode figure', () => {
  it('is the calibration until enough live steps came, then their median', () => {
    const p = peer({ decodeMsPerLayer: 0.1, prefillMsPerTokenLayer: 0.02 });
    expect(plannedSpeed(p)).toEqual({ decodeMsPerLayer: 0.1, prefillMsPerTokenLayer: 0.02, source: 'calibration', calibration: 0.1, live: null });
    for (let i = 0; i < MIN_LIVE_STEPS - 1; i++) noteDecodeCost(p, 3);
    expect(plannedSpeed(p)!.source).toBe('calibration');
    noteDecodeCost(p, 50); // one outlier among them
    const s = plannedSpeed(p)!;
    expect(s).toMatchObject({ source: 'live', decodeMsPerLayer: 3, calibration: 0.1, prefillMsPerTokenLayer: 0.02, live: { decodeMsPerLayer: 3, steps: MIN_LIVE_STEPS } });
    // a peer that got fast again: the window forgets the slow steps
    for (let i = 0; i < LIVE_WINDOW; i++) noteDecodeCost(p, 0.2);
    expect(plannedSpeed(p)).toMatchObject({ source: 'live', decodeMsPerLayer: 0.2, live: { steps: LIVE_WINDOW } });
  });

  it('forgets steps older than LIVE_MAX_AGE_MS: a peer left out for being slow gets its calibration back', () => {
    const p = peer({ decodeMsPerLayer: 0.1, prefillMsPerTokenLayer: 0.02 });
    const t0 = Date.now();
    for (let i = 0; i < MIN_LIVE_STEPS; i++) noteDecodeCost(p, 4, t0 + i);
    expect(plannedSpeed(p, t0 + LIVE_MAX_AGE_MS)).toMatchObject({ source: 'live', decodeMsPerLayer: 4 });
    expect(plannedSpeed(p, t0 + LIVE_MAX_AGE_MS + 1)).toMatchObject({ source: 'calibration', decodeMsPerLayer: 0.1, live: { steps: MIN_LIVE_STEPS - 1 } });
    expect(plannedSpeed(p, t0 + 2 * LIVE_MAX_AGE_MS)).toMatchObject({ source: 'calibration', live: null });
  });

  it('is the live one where the peer never calibrated, once enough steps came; a figure that is not a time is no step', () => {
    const p = peer();
    expect(plannedSpeed(p)).toBeUndefined();
    noteDecodeCost(p, Number.NaN);
    noteDecodeCost(p, -1);
    for (let i = 0; i < MIN_LIVE_STEPS - 1; i++) noteDecodeCost(p, 0.5);
    expect(plannedSpeed(p)).toBeUndefined();
    noteDecodeCost(p, 0.5);
    expect(plannedSpeed(p)).toEqual({ decodeMsPerLayer: 0.5, prefillMsPerTokenLayer: null, source: 'live', calibration: null, live: { decodeMsPerLayer: 0.5, steps: MIN_LIVE_STEPS } });
  });
});
