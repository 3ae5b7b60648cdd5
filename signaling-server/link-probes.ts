// When a peer joins, the room asks for the round trips between it and the peers already there
// (peer/link-probe.ts does the timing): a newcomer that probes (hello `probesLinks`) times its
// link to every other peer with a listen address; one that does not, but listens, is timed by
// each peer already there that probes. Every `intervalMs` after (`serve --link-probe-interval`,
// default 30 s) each pair that can be timed is timed again, once, by one end — networks change
// under a room: a laptop leaves the LAN, a link congests — and a peer still busy with the last
// round is not asked again. The answers fill the room's link matrix (./link-matrix.ts), which
// the planner that knows links and the idle re-planner read. A peer that cannot be reached from
// another (a NAT, a firewall) is logged once and left to the star estimate — also one it reached
// before: its old figure is forgotten.

import type { LinksProbed, ServerToPeer } from '../src/protocol/control.ts';
import { MAX_PROBED_LINKS } from '../src/protocol/control.ts';
import type { LinkMatrix } from './link-matrix.ts';
import type { Peer } from './room-peer.ts';

export interface ProbingRoom {
  readonly peers: ReadonlyMap<string, Peer>;
  readonly links: LinkMatrix;
  send(peer: Peer, msg: ServerToPeer): void;
  log(line: string): void;
}

/** How often every pair is timed again by default (ms). */
export const LINK_PROBE_MS = 30_000;

/** Who times the link between `x` and `y`: one that probes, the other listening (`x` first); null when neither can. */
function proberOf(x: Peer, y: Peer): { prober: Peer; target: Peer } | null {
  if (x.hello.probesLinks && y.hello.listen) return { prober: x, target: y };
  if (y.hello.probesLinks && x.hello.listen) return { prober: y, target: x };
  return null;
}

export class LinkProbes {
  private nextId = 1;
  /** probes asked and not answered: id → the prober, the peers it was asked to time, and when */
  private readonly asked = new Map<number, { prober: string; targets: Set<string>; at: number }>();
  /** pairs logged as not measured (logged once, not every round) */
  private readonly unreachable = new Set<string>();
  private readonly timer: NodeJS.Timeout | null;

  constructor(
    private readonly room: ProbingRoom,
    private readonly intervalMs = LINK_PROBE_MS,
  ) {
    this.timer = intervalMs > 0 ? setInterval(() => this.again(), intervalMs) : null;
    this.timer?.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  /** Every pair that can be timed, timed again by one end (a prober still answering the last round skipped). */
  again(): void {
    // a target's probe gives up within seconds: one unanswered for a minute (and a round) was lost (a socket that reconnected)
    for (const [id, a] of this.asked) if (performance.now() - a.at >= Math.max(this.intervalMs, 60_000)) this.asked.delete(id);
    const peers = [...this.room.peers.values()].filter((p) => !p.gone);
    const busy = new Set([...this.asked.values()].map((a) => a.prober));
    const rounds = new Map<Peer, Peer[]>();
    for (let i = 0; i < peers.length; i++) {
      for (let j = i + 1; j < peers.length; j++) {
        const pair = proberOf(peers[i]!, peers[j]!);
        if (pair && !busy.has(pair.prober.id)) rounds.set(pair.prober, [...(rounds.get(pair.prober) ?? []), pair.target]);
      }
    }
    for (const [prober, targets] of rounds) this.ask(prober, targets);
  }

  /** A peer joined: time its links to the peers already here. */
  joined(peer: Peer): void {
    const others = [...this.room.peers.values()].filter((p) => p.id !== peer.id && !p.gone);
    if (peer.hello.probesLinks) this.ask(peer, others.filter((p) => p.hello.listen));
    else if (peer.hello.listen) for (const p of others.filter((o) => o.hello.probesLinks)) this.ask(p, [peer]);
  }

  /** A `links-probed` answer: its round trips go into the matrix, its failures into the log. */
  onResults(peer: Peer, msg: LinksProbed): void {
    const asked = this.asked.get(msg.id);
    if (!asked || asked.prober !== peer.id) return; // not a probe this room asked of this peer
    this.asked.delete(msg.id);
    for (const r of msg.results) {
      if (!asked.targets.has(r.peer) || !this.room.peers.has(r.peer)) continue;
      const pair = `${peer.id} → ${r.peer}`;
      if (r.rttMs !== undefined) {
        this.room.links.record(peer.id, r.peer, r.rttMs, 'probe');
        this.unreachable.delete(pair);
      } else {
        // what it measured before was of a path that is gone (a laptop off the LAN): the star speaks for the pair now
        this.room.links.forget(peer.id, r.peer);
        if (!this.unreachable.has(pair)) this.room.log(`link ${pair}: not measured (${r.error ?? 'no reason given'}); the planner takes the star through this server for it`);
        this.unreachable.add(pair);
      }
    }
  }

  /** A peer left: its unanswered probes go too. */
  gone(peerId: string): void {
    for (const [id, a] of this.asked) if (a.prober === peerId) this.asked.delete(id);
    for (const pair of this.unreachable) if (pair.startsWith(`${peerId} → `) || pair.endsWith(` → ${peerId}`)) this.unreachable.delete(pair);
  }

  private ask(prober: Peer, targets: Peer[]): void {
    for (let i = 0; i < targets.length; i += MAX_PROBED_LINKS) {
      const batch = targets.slice(i, i + MAX_PROBED_LINKS);
      const id = this.nextId++;
      this.asked.set(id, { prober: prober.id, targets: new Set(batch.map((t) => t.id)), at: performance.now() });
      this.room.send(prober, { t: 'probe-links', id, targets: batch.map((t) => ({ peer: t.id, url: t.hello.listen! })) });
    }
  }
}
