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
import { helloProof } from '../protocol/control.ts';
import type { PeerHello, PeerToServer, ServerMessage, ServerToPeer } from '../protocol/control.ts';
import { headerFromWire } from '../protocol/header-wire.ts';
import type { Frame } from '../protocol/frame.ts';
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
export const stageSampler: SamplerFactory = (settings) => {
  const sampler = new Sampler(settings);
  return (logits) => sampler.sample(logits, []);
};

/** The room's model as the server describes it: its id, its manifest, and its header (read once, on demand). */
export interface RoomModel {
  id: string;
  manifest: Manifest;
  header(): Promise<GgufHeader>;
}

/** Reads the room's model id and manifest (JSON from the server: no model bytes). */
export async function fetchRoomModel(base: string, roomId: string, secret: string): Promise<RoomModel> {
  const room = await fetchJson<{ model: { id: string } }>(`${base}/v1/rooms/${roomId}`, secret);
  const api = `${base}/v1/models/${encodeURIComponent(room.model.id)}`;
  const manifest = parseManifest(await fetchJson<unknown>(`${api}/manifest`, secret));
  let header: GgufHeader | null = null;
  return { id: room.model.id, manifest, header: async () => (header ??= headerFromWire(await fetchJson<unknown>(`${api}/header`, secret))) };
}

/**
 * Headers for reading the model: the room secret and peer id go only to the signaling server's
 * own model hosting. A third-party URL (a model hub) gets none — the secret must not leak, and
 * custom headers would make its CORS preflight fail.
 */
export function modelHeaders(modelUrl: string, serverBase: string, secret: string, peerId: string | null): Record<string, string> {
  if (new URL(modelUrl).origin !== new URL(serverBase).origin) return {};
  return { authorization: `Bearer ${secret}`, 'x-mesh-peer': peerId ?? 'unknown' };
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

/** One load of an assigned shard, as the environment sees it. */
export interface LoadContext {
  readonly assignment: Assignment;
  /** false once a release or a newer assignment superseded this load */
  readonly current: boolean;
  /** keeps `undo` for when the stage is released, or this load fails or is superseded (last kept, first undone) */
  keep<T>(thing: T, undo: (thing: T) => Promise<unknown>): T;
}

/** What the environment's load produced: a backend holding the shard and the link to the next stage. */
export interface StageLoad {
  backend: StageBackend;
  downstream: FrameLink | null;
  /** bytes read for the shard (reported in `ready`) */
  bytesRead: number;
  /** for the log: what was read, how the next stage is reached */
  detail: string;
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
  /** loads the assigned shard into a backend and links it to the next stage */
  loadStage: (ctx: LoadContext) => Promise<StageLoad>;
  /** told as an assignment arrives, before the previous stage is released */
  onAssign?: (a: Assignment) => void;
  onReady?: (a: Assignment, load: StageLoad) => void;
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
  kept: Kept;
}

export class PeerCore {
  peerId: string | null = null;
  private serving: Serving | null = null;
  /** the route the server assigned (loading, ready or failed), until it releases it */
  private assigned: Assignment | null = null;
  /** bumped by every assignment and release: a load that finds it moved was superseded */
  private seq = 0;
  private joining: { resolve: (w: Welcome) => void; reject: (e: Error) => void; offer: HelloOffer } | null = null;

  constructor(private readonly opts: PeerCoreOptions) {}

  /** The stage being served, once assigned and loaded. */
  get service(): StageService | null {
    return this.serving?.service ?? null;
  }

  /** The route of the stage being served. */
  get routeId(): number | null {
    return this.serving?.assignment.routeId ?? null;
  }

  /** Frames for this peer's stage (from the server, or an upstream stage). */
  readonly handle = async (f: Frame): Promise<Frame> => {
    if (!this.serving) throw new MeshError('STAGE_NOT_LOADED', 'this peer serves no stage yet');
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

  /** A control message from the server; false for those the environment handles (signal, relay-reply). */
  onMessage(msg: ServerMessage): boolean {
    switch (msg.t) {
      case 'challenge': {
        const offer = this.joining?.offer;
        if (offer) void helloProof(this.opts.proofSecret ?? this.opts.secret, msg.nonce).then((proof) => this.opts.send({ t: 'hello', proof, ...offer }));
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
      case 'watch':
        if (this.serving?.assignment.routeId === msg.routeId) this.serving.service.watch(msg.sessionId);
        return true;
      default:
        return false;
    }
  }

  private async assign(a: Assignment): Promise<void> {
    const seq = ++this.seq;
    const t0 = performance.now();
    this.assigned = a;
    this.opts.onAssign?.(a);
    const kept = new Kept();
    const self = this;
    const ctx: LoadContext = {
      assignment: a,
      get current() {
        return seq === self.seq;
      },
      keep: kept.keep,
    };
    try {
      await this.releaseStage();
      const load = await this.opts.loadStage(ctx);
      const spotCheck = await this.spotCheckFor(ctx);
      if (!ctx.current) return void (await kept.undo());
      const service = new StageService({ ...this.opts.limits, backend: load.backend, stage: a.stage, shard: a.shard, nLayer: a.nLayer, downstream: load.downstream, samplerFactory: stageSampler, spotCheck });
      this.serving = { assignment: a, service, kept };
      this.opts.onReady?.(a, load);
      this.opts.log(`stage ${a.stage} of route ${a.routeId}: layers ${a.shard.start}-${a.shard.end} ready (${load.detail})`);
      this.opts.send({ t: 'ready', routeId: a.routeId, stage: a.stage, loadMs: performance.now() - t0, bytesRead: load.bytesRead });
    } catch (e) {
      await kept.undo().catch(() => undefined);
      if (!ctx.current) return; // released or superseded meanwhile
      const err = e instanceof MeshError ? e : new MeshError('LOAD_FAILED', (e as Error).message);
      this.opts.onFailed?.(a, err);
      this.opts.log(`stage ${a.stage} of route ${a.routeId}: load failed: ${err.code} ${err.message}`);
      this.opts.send({ t: 'load-failed', routeId: a.routeId, stage: a.stage, code: err.code, message: err.message });
    }
  }

  /**
   * Public rooms: the first stage also loads the untrusted stages' layers (`check`), as a shard
   * with no next stage, kept and undone with the stage; every stage can report what it receives.
   */
  private async spotCheckFor(ctx: LoadContext): Promise<SpotCheck> {
    const a = ctx.assignment;
    if (!a.check) return new SpotCheck({ fraction: 0, send: this.opts.send });
    const checkCtx: LoadContext = {
      assignment: { ...a, shard: a.check.shard, downstream: null, downstreamPeer: null, check: undefined },
      get current() {
        return ctx.current;
      },
      keep: ctx.keep,
    };
    const checkLoad = await this.opts.loadStage(checkCtx);
    this.opts.log(`spot checks: layers ${a.check.shard.start}-${a.check.shard.end} loaded to re-run ${Math.round(a.check.fraction * 100)} % of sessions`);
    return new SpotCheck({ backend: checkLoad.backend, fraction: a.check.fraction, send: this.opts.send });
  }

  private release(): void {
    this.seq++; // a load still in flight for this route is discarded when it finishes
    this.assigned = null;
    void this.releaseStage();
    this.opts.onRelease?.();
  }

  /** Sessions first, then what the load kept (next-stage link, source, backend). */
  private async releaseStage(): Promise<void> {
    const s = this.serving;
    this.serving = null;
    if (!s) return;
    await s.service.releaseAll();
    await s.kept.undo();
  }

  /** Releases the stage and discards a load in flight (the peer is leaving). */
  async close(): Promise<void> {
    this.seq++;
    this.assigned = null;
    await this.releaseStage();
  }
}
