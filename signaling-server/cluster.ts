// This instance's part in a cluster of `serve` instances sharing one Redis (serve --redis).
// Every instance opens the same rooms (same models, same secret: the same room ids); one
// instance at a time holds each room — a lease in Redis fenced by an epoch (directory.ts) — and
// runs it as a lone server would: admits its peers, plans its routes, drives its sessions. The
// others accept the room's peers and clients too and pass them to the holder over a direct link
// (instance-link.ts), so a load balancer may send anyone anywhere. The holder renews its leases;
// an instance that stops (kill -9, a partition) lets them expire and another takes them over,
// its peers reconnecting through the instances still alive. An instance that finds a lease gone
// (renewal refused, or Redis silent past the lease) stops hosting that room at once: a stale
// holder never plans beside the new one, and its writes under the old epoch are refused.

import { createHash, createHmac, randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { MeshError } from '../src/errors.ts';
import { secretMatches } from '../src/transport/frame-server.ts';
import { Directory } from './directory.ts';
import type { InstanceRecord, Lease } from './directory.ts';

/** The header an instance presents on a link to another: its id and an HMAC of it under the cluster key. */
export const INSTANCE_HEADER = 'x-mesh-instance';

export interface ClusterOptions {
  /** redis://host:port (or rediss://) */
  redisUrl: string;
  /** how the other instances reach this one (http(s)://host:port) */
  url: string;
  /** the rooms' join secret: the instance links' key is derived from it */
  secret: string;
  /** a room's lease lives this long unless renewed (ms, default 3 s): the takeover time after a crash */
  leaseMs?: number;
  /** Redis key prefix (default "gm:") */
  prefix?: string;
  log: (line: string) => void;
}

export interface ClusterHealth {
  instance: string;
  redis: 'ok' | 'unreachable';
  /** rooms this instance holds now */
  holds: string[];
}

export class Cluster {
  /** rooms held now, with their lease and when it was last renewed */
  private readonly held = new Map<string, { lease: Lease; renewedAt: number }>();
  private timer: NodeJS.Timeout | null = null;
  /** rooms seen with no lease, since when */
  private readonly freeSince = new Map<string, number>();
  private ticking: Promise<void> | null = null;
  private readonly key: Buffer;
  private readonly leaseMs: number;
  private stopped = false;
  /** the room's lease came to this instance: it hosts the room from now on */
  onGained: (roomId: string, lease: Lease) => void = () => undefined;
  /** the room's lease is gone (taken over, or not renewable in time): stop hosting it at once */
  onLost: (roomId: string, why: string) => void = () => undefined;
  /** whether a held room may move to the instance it prefers now (no peer and no session would notice) */
  movable: (roomId: string) => boolean = () => false;

  private constructor(
    readonly directory: Directory,
    readonly record: InstanceRecord,
    private readonly roomIds: () => string[],
    private readonly opts: ClusterOptions,
  ) {
    this.key = createHmac('sha256', opts.secret).update('gguf-mesh instance link').digest();
    this.leaseMs = opts.leaseMs ?? 3_000;
  }

  get id(): string {
    return this.record.id;
  }

  /** Joins the cluster: registers this instance (its number fixes its route ids) and starts taking and renewing room leases. */
  static async join(opts: ClusterOptions, roomIds: () => string[]): Promise<Cluster> {
    const directory = await Directory.connect(opts.redisUrl, opts.prefix ? { prefix: opts.prefix } : {});
    const id = `inst-${randomBytes(4).toString('hex')}`;
    const record = await directory.register(id, opts.url, instanceTtl(opts.leaseMs ?? 3_000));
    const c = new Cluster(directory, record, roomIds, opts);
    opts.log(`cluster: instance ${id} (#${record.seq}) at ${opts.url}, Redis ${opts.redisUrl}`);
    return c;
  }

  /** Route ids of this instance: its number in the high 16 bits, so ids never collide across instances. */
  get routeIdBase(): number {
    return this.record.seq * 0x10000;
  }

  /** Starts the lease loop (after the rooms are open); the first round runs now. */
  async start(): Promise<void> {
    await this.tick();
    this.timer = setInterval(() => void this.tick(), Math.max(100, Math.floor(this.leaseMs / 3)));
    this.timer.unref();
  }

  /** This instance's lease on the room, when it holds it. */
  holds(roomId: string): Lease | null {
    return this.held.get(roomId)?.lease ?? null;
  }

  /**
   * The instance that holds the room now: this one (null), another (its record), or — no live
   * holder — this one after taking the free lease at once. ROOM_ELSEWHERE when the holder's
   * record is gone (it died; its lease expires soon) or Redis does not answer.
   */
  async holderOf(roomId: string): Promise<InstanceRecord | null> {
    if (this.held.has(roomId)) return null;
    try {
      const lease = await this.directory.lease(roomId);
      if (!lease) {
        await this.tick();
        if (this.held.has(roomId)) return null;
      }
      const now = lease ?? (await this.directory.lease(roomId));
      const rec = now ? await this.directory.instance(now.instance) : null;
      if (!rec) throw new MeshError('ROOM_ELSEWHERE', `room ${roomId}: its holder ${now?.instance ?? '(none)'} is not alive; retry once its lease expires`, { retryAfterS: Math.ceil(this.leaseMs / 1000) });
      return rec;
    } catch (e) {
      if (e instanceof MeshError) throw e;
      throw new MeshError('ROOM_ELSEWHERE', `room ${roomId}: Redis does not answer (${(e as Error).message})`, { retryAfterS: 1 });
    }
  }

  /** The instance that made route `routeId` (its number is the id's high half), null when that is this one. */
  async instanceOfRoute(routeId: number): Promise<InstanceRecord | null> {
    const seq = Math.floor(routeId / 0x10000);
    if (seq === this.record.seq) return null;
    return this.directory.instanceBySeq(seq);
  }

  /** The instance driving session `sessionId` (null: this one, or unknown). */
  async instanceOfSession(sessionId: string): Promise<InstanceRecord | null> {
    const id = await this.directory.sessionInstance(sessionId);
    if (!id || id === this.id) return null;
    return this.directory.instance(id);
  }

  /** The header value that proves a link comes from this instance. */
  linkProof(): string {
    return `${this.id}.${createHmac('sha256', this.key).update(this.id).digest('hex')}`;
  }

  /** Whether `req` came over another instance's link (a valid proof); a request with a bad proof is AUTH_FAILED. */
  fromInstance(req: IncomingMessage): boolean {
    const v = req.headers[INSTANCE_HEADER];
    if (v === undefined) return false;
    const [id, mac] = String(v).split('.');
    if (!id || !mac || !secretMatches(mac, createHmac('sha256', this.key).update(id).digest('hex'))) throw new MeshError('AUTH_FAILED', `${INSTANCE_HEADER}: not a proof under this cluster's key`);
    return true;
  }

  /** Publishes a held room's state (its route) under its lease; a refused write means the lease moved on: the room is dropped here. */
  async publish(roomId: string, state: unknown): Promise<void> {
    const h = this.held.get(roomId);
    if (!h) return;
    try {
      await this.directory.publishRoom(roomId, h.lease, state);
    } catch (e) {
      if (e instanceof MeshError && e.code === 'STALE_LEASE') this.lose(roomId, e.message);
      else this.opts.log(`cluster: publishing room ${roomId} failed: ${(e as Error).message}`);
    }
  }

  /** Records this instance as the driver of a session of a room it holds. */
  async claimSession(sessionId: string, roomId: string, ttlMs: number): Promise<void> {
    const h = this.held.get(roomId);
    if (h) await this.directory.claimSession(sessionId, roomId, h.lease, ttlMs).catch((e: Error) => this.opts.log(`cluster: session ${sessionId}: ${e.message}`));
  }

  /** A line in this instance's log, prefixed as the cluster's. */
  log(line: string): void {
    this.opts.log(`cluster: ${line}`);
  }

  async health(): Promise<ClusterHealth> {
    return { instance: this.id, redis: (await this.directory.reachable()) ? 'ok' : 'unreachable', holds: [...this.held.keys()] };
  }

  private lose(roomId: string, why: string): void {
    if (!this.held.delete(roomId)) return;
    this.opts.log(`cluster: room ${roomId} lost: ${why}`);
    this.onLost(roomId, why);
  }

  /** One round: renew the held leases, take the free ones; a lease not renewed within its life is given up here too. */
  private tick(): Promise<void> {
    this.ticking ??= this.round().finally(() => (this.ticking = null));
    return this.ticking;
  }

  private async round(): Promise<void> {
    if (this.stopped) return;
    await this.directory.refresh(this.record, instanceTtl(this.leaseMs)).catch(() => undefined);
    let alive: string[] | null = null;
    for (const roomId of this.roomIds()) {
      const before = this.held.get(roomId);
      if (!before) {
        // a free room goes to the instance it hashes to among the live ones (rooms spread over
        // the instances); any other takes it once it stayed free a whole lease (that one is gone)
        const current = await this.directory.lease(roomId).catch(() => undefined);
        if (current !== null) {
          this.freeSince.delete(roomId);
          continue;
        }
        const since = this.freeSince.get(roomId) ?? Date.now();
        this.freeSince.set(roomId, since);
        alive ??= await this.directory.instanceIds().catch(() => [this.id]);
        if (preferredInstance(roomId, alive) !== this.id && Date.now() - since < this.leaseMs) continue;
      }
      else if (this.movable(roomId)) {
        // an idle room held here that prefers another live instance moves there (an instance
        // that started first took every room; the others come later)
        alive ??= await this.directory.instanceIds().catch(() => [this.id]);
        const preferred = preferredInstance(roomId, alive);
        if (preferred !== null && preferred !== this.id && (await this.directory.release(roomId, before.lease).catch(() => false))) {
          this.lose(roomId, `moved to instance ${preferred}, which it prefers`);
          continue;
        }
      }
      let lease: Lease;
      try {
        lease = await this.directory.acquire(roomId, this.id, this.leaseMs);
      } catch (e) {
        // Redis silent: past the lease's life another instance may hold it — stop hosting first
        if (before && Date.now() - before.renewedAt > this.leaseMs * 0.8) this.lose(roomId, `its lease could not be renewed for ${Date.now() - before.renewedAt} ms (${(e as Error).message})`);
        continue;
      }
      if (this.stopped) return;
      const mine = lease.instance === this.id;
      if (before && (!mine || lease.epoch !== before.lease.epoch)) this.lose(roomId, mine ? `the lease lapsed (epoch ${before.lease.epoch} → ${lease.epoch})` : `instance ${lease.instance} holds it now (epoch ${lease.epoch})`);
      if (!mine) continue;
      const had = this.held.get(roomId);
      this.held.set(roomId, { lease, renewedAt: Date.now() });
      if (!had) {
        this.freeSince.delete(roomId);
        this.opts.log(`cluster: room ${roomId} held (epoch ${lease.epoch})`);
        this.onGained(roomId, lease);
      }
    }
  }

  /** Leaves the cluster: the leases are given up (another instance takes the rooms at once) and the record removed. */
  async close(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.ticking?.catch(() => undefined);
    for (const [roomId, h] of this.held) await this.directory.release(roomId, h.lease).catch(() => undefined);
    this.held.clear();
    await this.directory.deregister(this.record).catch(() => undefined);
    await this.directory.close();
  }
}

/** The instance a room prefers among `ids`: the highest hash of (room, instance) — rendezvous hashing, so a new or lost instance moves only its share. */
export function preferredInstance(roomId: string, ids: readonly string[]): string | null {
  let best: string | null = null;
  let bestHash = '';
  for (const id of ids) {
    const h = createHash('sha256').update(`${roomId}\n${id}`).digest('hex');
    if (h > bestHash) [best, bestHash] = [id, h];
  }
  return best;
}

/** An instance record outlives a lease a little: a holder's record is there while its lease is. */
function instanceTtl(leaseMs: number): number {
  return leaseMs * 2;
}
