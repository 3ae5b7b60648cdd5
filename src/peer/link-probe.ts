// A native peer's side of the link matrix (signaling-server/link-matrix.ts): asked by the server
// (`probe-links`), it opens a frame link to each named peer's listen address — the very path a
// stage's hidden states would take to it — and times a few Status frames of no session there,
// which a peer answers at once whether or not it serves a stage. The fastest of them is the
// link's round trip (the others waited on a busy process or a first packet's setup). The server
// learns from it what a star through its own network cannot say: two peers on one LAN are close
// to each other however far both are from the server.

import { FrameType, makeFrame, NIL_SESSION } from '../protocol/frame.ts';
import type { LinksProbed, ProbeLinks } from '../protocol/control.ts';
import type { FrameLink } from '../transport/link.ts';
import { WsLink } from '../transport/ws.ts';
import { withTimeout } from '../route/session-types.ts';

/** Status frames timed per link after the first (which also pays for the new connection's warm-up) */
export const PROBE_SAMPLES = 5;
/** a peer that does not answer within this long is reported unreachable (ms) */
const PROBE_TIMEOUT_MS = 5_000;

export interface LinkProbeOptions {
  secret: string;
  /** wraps each link (a test's link delay: peer/test-shaping.ts delayedLink) */
  wrap?: (link: FrameLink) => FrameLink;
}

/** The round trip to one peer's listen address (ms): the fastest of PROBE_SAMPLES Status frames after a first one. */
export async function probeLink(url: string, opts: LinkProbeOptions): Promise<number> {
  // no peer declared (x-mesh-peer): the target's upstream fence then refuses no Status frame of ours, and logs nothing
  const raw = await WsLink.connect(url, { headers: { authorization: `Bearer ${opts.secret}` }, connectTimeoutMs: PROBE_TIMEOUT_MS });
  const link = opts.wrap ? opts.wrap(raw) : raw;
  try {
    const ping = async (): Promise<number> => {
      const t0 = performance.now();
      await withTimeout(link.request(makeFrame({ type: FrameType.Status, sessionId: NIL_SESSION })), PROBE_TIMEOUT_MS, `no answer to a Status at ${url}`);
      return performance.now() - t0;
    };
    await ping();
    let best = Infinity;
    for (let i = 0; i < PROBE_SAMPLES; i++) best = Math.min(best, await ping());
    return best;
  } finally {
    await raw.close();
  }
}

/** Answers a `probe-links`: each target probed in turn (one at a time, so the probes do not queue behind each other). */
export async function probeLinks(msg: ProbeLinks, opts: LinkProbeOptions): Promise<LinksProbed> {
  const results: LinksProbed['results'] = [];
  for (const t of msg.targets) {
    try {
      results.push({ peer: t.peer, rttMs: Math.round((await probeLink(t.url, opts)) * 1000) / 1000 });
    } catch (e) {
      results.push({ peer: t.peer, error: (e as Error).message.slice(0, 512) });
    }
  }
  return { t: 'links-probed', id: msg.id, results };
}
