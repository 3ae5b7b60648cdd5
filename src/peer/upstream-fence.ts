// Which connections may feed a native stage hidden states: only its current previous stage.
// A peer declared lost (a SIGSTOP'd process, a network blackout) can come back and still work
// through frames buffered in its sockets; after a repair those would reach its old next stage
// at positions the session has rewound to, and be computed (on the last stage: a seeded draw
// spent, a token returned). The upstream declares its peer id on the frames socket it opens
// (`x-mesh-peer`, frame-server.ts); the stage learns its upstream from its assignment and from
// every rewire, and refuses the rest with NOT_UPSTREAM.
//
// A connection that declares no peer (the server's entry link into stage 0, an older peer) may
// still send hidden states while its previous stage is the one the assignment named: it can
// only be that peer. Once a repair has given the stage another upstream, only declared frames
// from it are served. Frames that arrive other than through the listening carriers (the
// control socket: the server's session control and repair requests, relayed frames the server
// checked) have no origin and are never fenced. Ring tokens (a Ring-flagged Status, from the last
// stage to stage 0) pass from any peer: they only complete a step the session manager sent ahead
// (and only at the session's ring generation), and a session a repair rebuilt sends none ahead.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import type { FrameOrigin } from '../transport/link.ts';

export interface RefusedFrame {
  from: string | null;
  expected: string | null;
  type: string;
  position: number;
  sessionId: string;
}

export interface FenceStatus {
  upstream: string | null;
  /** the upstream changed since the assignment (undeclared hidden states are refused from then on) */
  rewired: boolean;
  refused: number;
  lastRefused: RefusedFrame | null;
}

export class UpstreamFence {
  private upstream: string | null = null;
  private rewired = false;
  private refused = 0;
  private lastRefused: RefusedFrame | null = null;

  constructor(private readonly log: (line: string) => void = () => undefined) {}

  /** A new assignment: its previous stage (null on stage 0). */
  assigned(peerId: string | null): void {
    this.upstream = peerId;
    this.rewired = false;
  }

  /** A rewire named a (possibly new) previous stage. */
  moved(peerId: string | null): void {
    if (peerId !== this.upstream) this.rewired = true;
    this.upstream = peerId;
  }

  /** Throws NOT_UPSTREAM when `f` came from a connection that is not the current upstream's. */
  admit(f: Frame, origin: FrameOrigin | undefined): void {
    if (!origin || (f.type === FrameType.Status && f.flags & FrameFlag.Ring)) return;
    const declared = origin.peer;
    if (declared === null ? f.type !== FrameType.Hidden || !this.rewired : declared === this.upstream) return;
    this.refused++;
    const refused: RefusedFrame = { from: declared, expected: this.upstream, type: FrameType[f.type] ?? String(f.type), position: f.position, sessionId: f.sessionId };
    this.lastRefused = refused;
    const sender = declared === null ? 'a connection that named no peer' : `peer ${declared}`;
    const why = `${refused.type} frame (session ${f.sessionId.slice(0, 8)}…, position ${f.position}) from ${sender} refused: this stage's upstream is ${this.upstream ?? 'none (it takes tokens from the server)'}${this.rewired ? ' since a repair' : ''}`;
    this.log(why);
    throw new MeshError('NOT_UPSTREAM', why, { from: declared, expected: this.upstream });
  }

  status(): FenceStatus {
    return { upstream: this.upstream, rewired: this.rewired, refused: this.refused, lastRefused: this.lastRefused };
  }
}
