// What every peer does the same way, native node or browser tab: read the room's model and
// manifest, answer the server's challenge with a hello (the HMAC proof and what it offers),
// take an assignment — release the stage it served, load the new shard, then report ready or
// load-failed — take a release, and serve the loaded stage as a StageService wired to the link
// to the next stage. How a shard's bytes are read, which backend computes them and how the
// next stage is reached belong to the environment, which hands them in as `loadStage`
// (native-stage.ts: file cache, ws/http links; browser-stage.ts: IndexedDB/OPFS, WebRTC hops).

import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import type { GgufHeader } from '../gguf/types.ts';
import type { Manifest } from '../gguf/verify.ts';
import { parseManifest } from '../gguf/verify.ts';
import { Sampler } from '../model/sampler.ts';
import { helloProof, toBase64 } from '../protocol/control.ts';
import type { CandidatePair, HopKind, PeerHello, PeerToServer, ServerMessage, ServerToPeer } from '../protocol/control.ts';
import { headerFromWire } from '../protocol/header-wire.ts';
import { encodeFrame, FrameType, NIL_SESSION } from '../protocol/frame.ts';
import { jsonFrame, replyAddress } from '../protocol/payload.ts';
import type { Frame } from '../protocol/frame.ts';
import { PEER_HEADER } from '../transport/link.ts';
import type { FrameLink } from '../transport/link.ts';
import { fetchJson } from '../transport/server-json.ts';
import { SpotCheck } from './spot-check.ts';
import { StageService } from './stage-service.ts';
import type { SamplerFactory, StageServiceOptions } from './stage-service.ts';

export type Assignment = Extract<ServerToPeer, { t: 'assign' }>;
export type Welcome = Extract<ServerToPeer, { t: 'welcome' }>;
/** What a peer's hello offers, besides the proof. */
export type HelloOffer = Omit<PeerHello, 't' | 'proof'>;

/** The last stage's sampler for a session's settings (seeded, as the session asks). */
export const stageSampler: SamplerFactory = (settings, draws) => {
  const sampler = new Sampler(settings).skip(draws);
  return (logits, history) => sampler.sample(logits, history);
};

/** The room's model as the server describes it: its id, its manifest, and its header (read once, on demand). */
export interface RoomModel {
  id: string;
  manifest: Manifest;
  header(): Promise<GgufHeader>;
  /** where the model is read, as the room describes it (at this server's origin when it hosts it), and its layers */
  url?: string;
  nLayer?: number;
  /** how the room plans routes: 'speed' wants each peer's measured speed in its hello */
  planner?: string;
}

/** Reads the room's model id and manifest (JSON from the server: no model bytes). */
/** How long a joining peer waits for the room's record. */
export const ROOM_FETCH_TIMEOUT_MS = 10_000;

export async function fetchRoomModel(base: string, roomId: string, secret: string): Promise<RoomModel> {
  // a server that does not answer this small record soon is stopped or frozen: the join fails and is tried again (behind a balancer: elsewhere)
  const room = await fetchJson<{ model: { id: string; url?: string; nLayer?: number }; planner?: string }>(`${base}/v1/rooms/${roomId}`, secret, { timeoutMs: ROOM_FETCH_TIMEOUT_MS });
  const api = `${base}/v1/models/${encodeURIComponent(room.model.id)}`;
  const manifest = parseManifest(await fetchJson<unknown>(`${api}/manifest`, secret));
  let header: GgufHeader | null = null;
  const hosted = room.model.url ? new URL(room.model.url) : null;
  const url = hosted && hosted.pathname.startsWith('/models/') ? `${base}${hosted.pathname}` : room.model.url;
  return {
    id: room.model.id, manifest, header: async () => (header ??= headerFromWire(await fetchJson<unknown>(`${api}/header`, secret))),
    ...(url ? { url } : {}), ...(room.model.nLayer ? { nLayer: room.model.nLayer } : {}), ...(room.planner ? { planner: room.planner } : {}),
  };
}

/**
 * Headers for reading the model: the room secret and peer id go only to the signaling server's
 * own model hosting. A third-party URL (a model hub) gets none — the secret must not leak, and
 * custom headers would make its CORS preflight fail.
 */
export function modelHeaders(modelUrl: string, serverBase: string, secret: string, peerId: string | null): Record<string, string> {
  if (new URL(modelUrl).origin !== new URL(serverBase).origin) return {};
  return { authorization: `Bearer ${secret}`, [PEER_HEADER]: peerId ?? 'unknown' };
}

/** A gate for progress reports: open at most once every `ms`, and always for the last one. */
export function progressGate(ms: number): (done: number, total: number) => boolean {
  let last = -Infinity;
  return (done, total) => {
    const now = performance.now();
    if (done < total && now - last < ms) return false;
    last = now;
    return true;
  };
}

/** One load of an assigned (or standby) shard, as the environment sees it. */
export interface LoadContext {
  readonly assignment: Assignment | Standby;
  /** false once a release or a newer assignment superseded this load */
  readonly current: boolean;
  /** keeps `undo` for when the stage is released, or this load fails or is superseded (last kept, first undone) */
  keep<T>(thing: T, undo: (thing: T) => Promise<unknown>): T;
}

export type Standby = Extract<ServerToPeer, { t: 'standby' }>;
export type Rewire = Extract<ServerToPeer, { t: 'rewire' }>;

/** What the environment's shard load produced: a backend holding the shard. */
export interface ShardLoad {
  backend: StageBackend;
  /** bytes read for the shard (reported in `ready`) */
  bytesRead: number;
  /** for the log: what was read */
  detail: string;
}

/** The next stage a link goes to: from an assignment, or a rewire after a repair. */
export interface NextStage {
  stage: number;
  shard: Assignment['shard'];
  nLayer: number;
  downstream: string | null;
  downstreamPeer?: string | null | undefined;
  /** the next stage answers a WebRTC data channel (a tab, or a native node with WebRTC) */
  downstreamRtc?: boolean | undefined;
  /** the ring's link from the last stage to stage 0: Status frames go on it, which binary HTTP has no endpoint for (so WebSocket, whatever the carrier) */
  ringLink?: boolean | undefined;
}

export interface NextLink {
  link: FrameLink | null;
  /** for the log: how the next stage is reached */
  detail: string;
  /** how the next stage is reached, for telemetry (native nodes report it; tabs keep it in their state) */
  hop?: { kind: HopKind; candidatePair: CandidatePair | null };
}

/** A stage's limits, as a peer's operator sets them (defaults: STAGE_LIMITS). */
export type StageLimits = Partial<Pick<StageServiceOptions, 'chunkTokens' | 'maxFrameTokens' | 'maxSessions' | 'idleTtlMs'>>;

export interface PeerCoreOptions {
  secret: string;
  /** the secret the hello proves when it is not the room secret (a public room's trusted peers) */
  proofSecret?: string;
  send: (m: PeerToServer) => void;
  log: (line: string) => void;
  limits?: StageLimits;
  /** loads an assigned or standby shard into a backend (verified bytes only) */
  loadShard: (ctx: LoadContext) => Promise<ShardLoad>;
  /** links the stage to its next stage (null on the last stage); `keep` its undo */
  linkNext: (next: NextStage, ctx: LoadContext) => Promise<NextLink>;
  /** a repair gave the stage a new previous stage (browser peers accept its data channel) */
  onUpstream?: (peerId: string | null) => void;
  /** told as an assignment arrives, before the previous stage is released */
  onAssign?: (a: Assignment) => void;
  onReady?: (a: Assignment, load: ShardLoad, link: NextLink) => void;
  onFailed?: (a: Assignment, err: MeshError) => void;
  /** told when the server released the assigned route */
  onRelease?: () => void;
}

/** Undo steps kept during a load, run last-first; every one runs even when one fails. */
class Kept {
  private readonly steps: Array<() => Promise<unknown>> = [];

  readonly keep = <T>(thing: T, undo: (thing: T) => Promise<unknown>): T => {
    this.steps.push(() => undo(thing));
    return thing;
  };

  async undo(): Promise<void> {
    let first: unknown = null;
    for (const step of this.steps.splice(0).reverse()) await step().catch((e: unknown) => (first ??= e));
    if (first) throw first;
  }
}

interface Serving {
  assignment: Assignment;
  service: StageService;
  /** the shard's backend and source */
  kept: Kept;
  /** the link to the next stage, replaced by a rewire */
  next: Kept;
}

/** A spare's shard, loaded ahead of an assignment. */
interface StandbyLoad {
  standby: Standby;
  loaded: Promise<{ load: ShardLoad; kept: Kept } | null>;
}

const sameShard = (a: { start: number; end: number }, b: { start: number; end: number }): boolean => a.start === b.start && a.end === b.end;

export class PeerCore {
  peerId: string | null = null;
  private serving: Serving | null = null;
  /** the route the server assigned (loading, ready or failed), until it releases it */
  private assigned: Assignment | null = null;
  /** bumped by every assignment and release: a load that finds it moved was superseded */
  private seq = 0;
  private joining: { resolve: (w: Welcome) => void; reject: (e: Error) => void; offer: HelloOffer } | null = null;
  private standby: StandbyLoad | null = null;
  /** a rewire that came while the stage was still loading: applied before it reports ready */
  private pendingRewire: Rewire | null = null;
  private leaving: ((moved: boolean) => void) | null = null;

  constructor(private readonly opts: PeerCoreOptions) {}

  /** The stage being served, once assigned and loaded. */
  get service(): StageService | null {
    return this.serving?.service ?? null;
  }

  /** The route of the stage being served. */
  get routeId(): number | null {
    return this.serving?.assignment.routeId ?? null;
  }

  /** The standby shard this spare holds (or is loading), if any. */
  get standbyShard(): Standby['shard'] | null {
    return this.standby?.standby.shard ?? null;
  }

  /** Frames for this peer's stage (from the server, or an upstream stage). */
  readonly handle = async (f: Frame): Promise<Frame> => {
    if (!this.serving) {
      // a Status of no session is answered serving or not: another peer timing its link to us (link-probe.ts)
      if (f.type === FrameType.Status && f.sessionId === NIL_SESSION) return jsonFrame(FrameType.Status, replyAddress(f), { serving: false });
      throw new MeshError('STAGE_NOT_LOADED', 'this peer serves no stage yet');
    }
    return this.serving.service.handle(f);
  };

  /**
   * challenge → hello → welcome: resolves with the welcome; rejects on the server's error
   * message, or with what `gone` settles to (the connection failed or closed first).
   */
  join(offer: HelloOffer, gone: Promise<Error>): Promise<Welcome> {
    return new Promise<Welcome>((resolve, reject) => {
      this.joining = { resolve, reject, offer };
      void gone.then(reject);
    });
  }

  /**
   * A graceful leave: tells the server, which hands this peer's stage to a replacement (its
   * sessions continue there); resolves with whether they moved, or false after `timeoutMs`.
   */
  leave(timeoutMs: number): Promise<boolean> {
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => done(false), timeoutMs);
      const done = (moved: boolean): void => {
        clearTimeout(timer);
        this.leaving = null;
        resolve(moved);
      };
      this.leaving = done;
      this.opts.send({ t: 'leave' });
    });
  }

  /** A control message from the server; false for those the environment handles (signal, relay-reply). */
  onMessage(msg: ServerMessage): boolean {
    switch (msg.t) {
      case 'challenge': {
        const offer = this.joining?.offer;
        if (offer) void helloProof(this.opts.proofSecret ?? this.opts.secret, msg.nonce).then((proof) => this.opts.send({ t: 'hello', proof, directReturn: true, verify: true, ...offer }));
        return true;
      }
      case 'welcome':
        this.peerId = msg.peerId;
        this.joining?.resolve(msg);
        return true;
      case 'error':
        // while joining, the refusal; later, the server telling why it dropped a message of ours
        if (this.joining && !this.peerId) this.joining.reject(MeshError.fromWire(msg.code, msg.message));
        else this.opts.log(`server: ${msg.code}: ${msg.message}`);
        return true;
      case 'assign':
        void this.assign(msg);
        return true;
      case 'release':
        if (this.assigned?.routeId === msg.routeId) this.release();
        return true;
      case 'standby':
        void this.loadStandby(msg);
        return true;
      case 'rewire':
        void this.rewire(msg);
        return true;
      case 'leave-ok':
        this.leaving?.(msg.moved);
        return true;
      case 'watch':
        if (this.serving?.assignment.routeId === msg.routeId) this.serving.service.watch(msg.sessionId);
        return true;
      default:
        return false;
    }
  }

  private context(a: Assignment | Standby, kept: Kept, isCurrent: () => boolean): LoadContext {
    return {
      assignment: a,
      get current() {
        return isCurrent();
      },
      keep: kept.keep,
    };
  }

  /** A spare loads its standby shard now, so taking over the stage later costs no download. */
  private async loadStandby(m: Standby): Promise<void> {
    if (this.standby && sameShard(this.standby.standby.shard, m.shard)) return;
    await this.dropStandby();
    const t0 = performance.now();
    const kept = new Kept();
    const entry: StandbyLoad = { standby: m, loaded: Promise.resolve(null) };
    this.standby = entry;
    entry.loaded = (async () => {
      try {
        const load = await this.opts.loadShard(this.context(m, kept, () => this.standby === entry));
        if (this.standby !== entry) {
          await kept.undo();
          return null;
        }
        this.opts.log(`standby: layers ${m.shard.start}-${m.shard.end} loaded (${load.detail})`);
        this.opts.send({ t: 'standby-ready', routeId: m.routeId, stage: m.stage, loadMs: performance.now() - t0, bytesRead: load.bytesRead });
        return { load, kept };
      } catch (e) {
        await kept.undo().catch(() => undefined);
        const err = e instanceof MeshError ? e : new MeshError('LOAD_FAILED', (e as Error).message);
        if (this.standby === entry) {
          this.standby = null;
          this.opts.send({ t: 'standby-failed', routeId: m.routeId, stage: m.stage, code: err.code, message: err.message });
        }
        return null;
      }
    })();
  }

  private async dropStandby(): Promise<void> {
    const s = this.standby;
    this.standby = null;
    const loaded = await s?.loaded;
    await loaded?.kept.undo().catch(() => undefined);
  }

  /** The standby's loaded shard when it is the one assigned (it stops being a standby). */
  private async takeStandby(a: Assignment): Promise<{ load: ShardLoad; kept: Kept } | null> {
    const s = this.standby;
    if (!s) return null;
    if (!sameShard(s.standby.shard, a.shard)) {
      await this.dropStandby();
      return null;
    }
    this.standby = null; // a load finishing now keeps its result for us
    return s.loaded;
  }

  private async assign(a: Assignment): Promise<void> {
    const seq = ++this.seq;
    const t0 = performance.now();
    this.assigned = a;
    this.pendingRewire = null;
    this.opts.onAssign?.(a);
    const ctx = this.context(a, new Kept(), () => seq === this.seq);
    const next = new Kept();
    let kept: Kept | null = null;
    try {
      await this.releaseStage();
      const warm = await this.takeStandby(a);
      let load: ShardLoad;
      if (warm) {
        ({ load, kept } = warm);
      } else {
        kept = new Kept();
        load = await this.opts.loadShard(this.context(a, kept, () => seq === this.seq));
      }
      const spotCheck = await this.spotCheckFor(a, kept, () => seq === this.seq);
      if (!ctx.current) throw new MeshError('LOAD_FAILED', 'superseded');
      const rewire = this.pendingRewire as Rewire | null;
      this.pendingRewire = null;
      const target: NextStage = rewire && ('downstream' in rewire || 'downstreamPeer' in rewire) ? { ...a, downstream: rewire.downstream ?? null, downstreamPeer: rewire.downstreamPeer ?? null, downstreamRtc: rewire.downstreamRtc } : a;
      if (rewire?.upstreamPeer !== undefined) this.opts.onUpstream?.(rewire.upstreamPeer);
      const link = await this.opts.linkNext(target, this.context(a, next, () => seq === this.seq));
      const ringLink = await this.ringLink(a, this.context(a, next, () => seq === this.seq));
      if (!ctx.current) throw new MeshError('LOAD_FAILED', 'superseded');
      // the last stage's one-way token goes to the server over the control socket (and, on the ring, to stage 0)
      const returnTo = (token: Frame): void => this.opts.send({ t: 'return', routeId: a.routeId, stage: a.stage, frame: toBase64(encodeFrame(token)) });
      const ring = ringLink ? (token: Frame): Promise<unknown> => ringLink.request(token) : undefined;
      const service = new StageService({ ...this.opts.limits, backend: load.backend, stage: a.stage, shard: a.shard, nLayer: a.nLayer, downstream: link.link, samplerFactory: stageSampler, spotCheck, returnTo, ring });
      this.serving = { assignment: a, service, kept, next };
      // a neighbour replaced while this stage was linking: link to it now
      const late = this.pendingRewire as Rewire | null;
      this.pendingRewire = null;
      if (late) await this.rewire(late);
      this.opts.onReady?.(a, load, link);
      this.opts.log(`stage ${a.stage} of route ${a.routeId}: layers ${a.shard.start}-${a.shard.end} ready (${warm ? 'from the standby shard; ' : ''}${load.detail}; ${link.detail})`);
      this.opts.send({ t: 'ready', routeId: a.routeId, stage: a.stage, loadMs: performance.now() - t0, bytesRead: warm ? 0 : load.bytesRead, ...(a.ring ? { ring: ringLink !== null } : {}) });
      if (rewire) this.opts.send({ t: 'rewired', routeId: a.routeId, stage: a.stage });
    } catch (e) {
      await next.undo().catch(() => undefined);
      await kept?.undo().catch(() => undefined);
      if (!ctx.current) return; // released or superseded meanwhile
      const err = e instanceof MeshError ? e : new MeshError('LOAD_FAILED', (e as Error).message);
      this.opts.onFailed?.(a, err);
      this.opts.log(`stage ${a.stage} of route ${a.routeId}: load failed: ${err.code} ${err.message}`);
      this.opts.send({ t: 'load-failed', routeId: a.routeId, stage: a.stage, code: err.code, message: err.message });
    }
  }

  /** The last stage of a ring route: its own link to stage 0's listen address, for the ring's tokens; null (said in the log) when none opens. */
  private async ringLink(a: Assignment, ctx: LoadContext): Promise<FrameLink | null> {
    if (!a.ring) return null;
    const l = await this.opts.linkNext({ ...a, downstream: a.ring.listen, downstreamPeer: a.ring.peer, downstreamRtc: false, ringLink: true }, ctx).catch((e: Error) => ({ link: null, detail: e.message }));
    if (!l.link) this.opts.log(`stage ${a.stage} of route ${a.routeId}: no ring link to stage 0 at ${a.ring.listen} (${l.detail}); tokens go the one-way path only`);
    return l.link;
  }

  /**
   * Public rooms: the first stage also loads the untrusted stages' layers (`check`), as a shard
   * kept and undone with the stage; every stage can report what it receives.
   */
  private async spotCheckFor(a: Assignment, kept: Kept, isCurrent: () => boolean): Promise<SpotCheck> {
    if (!a.check) return new SpotCheck({ fraction: 0, send: this.opts.send });
    const checkLoad = await this.opts.loadShard(this.context({ ...a, shard: a.check.shard, downstream: null, downstreamPeer: null, check: undefined }, kept, isCurrent));
    this.opts.log(`spot checks: layers ${a.check.shard.start}-${a.check.shard.end} loaded to re-run ${Math.round(a.check.fraction * 100)} % of sessions`);
    return new SpotCheck({ backend: checkLoad.backend, fraction: a.check.fraction, send: this.opts.send });
  }

  /** A repair replaced a neighbour: link to the new next stage, or accept the new previous one. */
  private async rewire(m: Rewire): Promise<void> {
    const s = this.serving;
    if (!s || s.assignment.routeId !== m.routeId || s.assignment.stage !== m.stage) {
      if (this.assigned?.routeId === m.routeId && this.assigned.stage === m.stage) this.pendingRewire = { ...(this.pendingRewire ?? {}), ...m };
      return;
    }
    try {
      if (m.upstreamPeer !== undefined) this.opts.onUpstream?.(m.upstreamPeer);
      if (m.downstream !== undefined || m.downstreamPeer !== undefined) {
        const next = new Kept();
        const link = await this.opts.linkNext({ ...s.assignment, downstream: m.downstream ?? null, downstreamPeer: m.downstreamPeer ?? null, downstreamRtc: m.downstreamRtc }, this.context(s.assignment, next, () => this.serving === s));
        const old = s.next;
        s.next = next;
        s.service.setDownstream(link.link);
        // steps in flight on the old link fail now; the session manager sends them again
        await old.undo().catch(() => undefined);
        this.opts.log(`stage ${m.stage} of route ${m.routeId}: rewired to ${link.detail}`);
      }
      this.opts.send({ t: 'rewired', routeId: m.routeId, stage: m.stage });
    } catch (e) {
      this.opts.log(`stage ${m.stage} of route ${m.routeId}: rewire failed: ${(e as Error).message}`);
    }
  }

  private release(): void {
    this.seq++; // a load still in flight for this route is discarded when it finishes
    this.assigned = null;
    void this.releaseStage();
    this.opts.onRelease?.();
  }

  /** Sessions first, then the next-stage link, then what the load kept (source, backend). */
  private async releaseStage(): Promise<void> {
    const s = this.serving;
    this.serving = null;
    if (!s) return;
    await s.service.releaseAll();
    await s.next.undo().catch(() => undefined);
    await s.kept.undo();
  }

  /** Releases the stage and any standby, and discards a load in flight (the peer is leaving). */
  async close(): Promise<void> {
    this.seq++;
    this.assigned = null;
    await this.releaseStage();
    await this.dropStandby();
  }
}
