// What a room knows of the links between its peers: the round trip of each pair that was
// measured — by one of them probing the other's listen address when it joined and every while
// after (`probe-links`, peer/link-probe.ts; ./link-probes.ts), or by ICE on a data channel a route opened between them (a stage's
// telemetry `candidatePair.rttMs`). The planner that knows speed and links takes a measured
// pair's one-way latency as half its round trip, and for the pairs nobody measured falls back to
// the star through the server's network (route/speed-planner.ts): two peers on one LAN are then
// close however far both are from the server, which the star cannot say.
//
// A pair keeps the fastest of its last few samples (a probe that met a busy process, or an ICE
// check during a long prefill, reads high; the link did not get longer) — few, so that a link
// that did get longer (a laptop gone from the LAN to a phone's hotspot) reads so after as many
// probes, and the idle re-planner can move the route off it (./speed-replan.ts).

export type LinkSource = 'probe' | 'ice';

export interface LinkRecord {
  a: string;
  b: string;
  /** the pair's round trip: the fastest of its recent samples (ms) */
  rttMs: number;
  /** what measured the sample that gave it */
  source: LinkSource;
}

interface Sample {
  rttMs: number;
  source: LinkSource;
}

/** samples kept per pair (a probe's sample is already the fastest of its own pings) */
export const LINK_WINDOW = 3;

/**
 * ICE's round trip comes in whole milliseconds (Chromium times its STUN checks so): a 0 is a
 * link under one, taken as half of one — not a free hop, which would give it no share of a
 * one-way step's wire time (route/token-return.ts) and the planner a link that costs nothing
 */
export const ICE_RTT_RESOLUTION_MS = 1;

const keyOf = (a: string, b: string): string => (a < b ? `${a}\u0000${b}` : `${b}\u0000${a}`);
const fastest = (samples: readonly Sample[]): Sample => samples.reduce((x, y) => (y.rttMs < x.rttMs ? y : x));

export class LinkMatrix {
  private readonly pairs = new Map<string, { a: string; b: string; samples: Sample[] }>();

  /** A measured round trip between peers `a` and `b` (ms); ignored for a peer with itself or a figure that is no duration. */
  record(a: string, b: string, rttMs: number, source: LinkSource): void {
    if (a === b || !Number.isFinite(rttMs) || rttMs < 0) return;
    if (source === 'ice' && rttMs === 0) rttMs = ICE_RTT_RESOLUTION_MS / 2;
    const key = keyOf(a, b);
    const pair = this.pairs.get(key) ?? { a: a < b ? a : b, b: a < b ? b : a, samples: [] };
    pair.samples.push({ rttMs, source });
    if (pair.samples.length > LINK_WINDOW) pair.samples.shift();
    this.pairs.set(key, pair);
  }

  /** The pair's round trip (ms), or undefined where nobody measured it. */
  rttMs(a: string, b: string): number | undefined {
    const pair = this.pairs.get(keyOf(a, b));
    return pair ? fastest(pair.samples).rttMs : undefined;
  }

  /** The one-way latency between `a` and `b` the planner takes: half the measured round trip, or undefined. */
  oneWayMs(a: string, b: string): number | undefined {
    const rtt = this.rttMs(a, b);
    return rtt === undefined ? undefined : rtt / 2;
  }

  /** Forgets the pair `a`–`b` (a probe that could no longer reach one from the other: its old figure is of a path that is gone). */
  forget(a: string, b: string): void {
    this.pairs.delete(keyOf(a, b));
  }

  /** Forgets every pair of a peer that left. */
  drop(peer: string): void {
    for (const [key, pair] of this.pairs) if (pair.a === peer || pair.b === peer) this.pairs.delete(key);
  }

  /** The measured links of one peer, by the other peer's id (its summary in the room's peer list). */
  of(peer: string): Record<string, { rttMs: number; source: LinkSource }> {
    const out: Record<string, { rttMs: number; source: LinkSource }> = {};
    for (const r of this.records()) if (r.a === peer || r.b === peer) out[r.a === peer ? r.b : r.a] = { rttMs: r.rttMs, source: r.source };
    return out;
  }

  /** Every measured pair. */
  records(): LinkRecord[] {
    return [...this.pairs.values()].map((p) => ({ a: p.a, b: p.b, ...fastest(p.samples) }));
  }
}
