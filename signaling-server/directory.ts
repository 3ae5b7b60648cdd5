// The shared directory of a cluster of `serve` instances (serve --redis): Redis holds which
// instances are alive and where they listen, which instance holds each room (a lease fenced by
// an epoch), each room's published state (its route, written only under the current epoch), and
// which instance drives each session. Everything ages out: a crashed instance's records expire
// with their TTL and its rooms' leases pass to another instance. Frames never go through Redis
// (cluster.ts links instances directly); these records are small and written rarely.
//
// Keys (prefix `gm:` by default):
//   instance:{id}      {"id","url","seq","startedAt"}           PX instance TTL, refreshed
//   instance-seq       INCR counter: each instance's number (route ids are seq << 16 | n)
//   seq:{n}            the instance id holding number n          PX instance TTL
//   room:{id}:lease    {"instance","epoch"}                      PX lease TTL, renewed by the holder
//   room:{id}:epoch    INCR counter: bumped each time the lease changes hands
//   room:{id}:state    JSON the holder publishes (route, stages) written only under its epoch
//   session:{id}       the instance id driving the session       PX session TTL
//   stream:{id}        a streamed completion's journal: {room, digest, seed}  PX journal TTL (stream-journal.ts)
//   stream:{id}:text   the text its client was sent so far (APPENDed)       PX journal TTL

import { Redis } from 'ioredis';
import { MeshError } from '../src/errors.ts';
import type { JournalMeta, JournalRecord, JournalStore } from './stream-journal.ts';

export interface InstanceRecord {
  id: string;
  /** how the other instances reach this one (http(s)://host:port) */
  url: string;
  seq: number;
  startedAt: number;
}

export interface Lease {
  instance: string;
  epoch: number;
}

// KEYS[1] lease, KEYS[2] epoch; ARGV[1] instance, ARGV[2] ttl ms.
// Takes a free lease (a new epoch) or renews one this instance holds (same epoch); returns the lease as it is now.
const ACQUIRE = `
local cur = redis.call('GET', KEYS[1])
if cur then
  local l = cjson.decode(cur)
  if l.instance == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return cur
end
local epoch = redis.call('INCR', KEYS[2])
local v = cjson.encode({instance = ARGV[1], epoch = epoch})
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return v`;

// KEYS[1] lease, KEYS[2] target; ARGV[1] instance, ARGV[2] epoch, ARGV[3] value, ARGV[4] ttl ms (0: none).
// Writes only while (instance, epoch) is the current lease: a stale holder's write is refused (0).
const FENCED_SET = `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local l = cjson.decode(cur)
if l.instance ~= ARGV[1] or tostring(l.epoch) ~= ARGV[2] then return 0 end
if ARGV[4] ~= '0' then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) else redis.call('SET', KEYS[2], ARGV[3]) end
return 1`;

// KEYS[1] lease; ARGV[1] instance, ARGV[2] epoch. Gives the lease up (a graceful stop) if it is still this one.
const RELEASE = `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local l = cjson.decode(cur)
if l.instance ~= ARGV[1] or tostring(l.epoch) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
return 1`;

export interface DirectoryOptions {
  /** key prefix (default "gm:"): several clusters may share one Redis */
  prefix?: string;
}

export class Directory implements JournalStore {
  private readonly prefix: string;

  private constructor(
    private readonly redis: Redis,
    opts: DirectoryOptions,
  ) {
    this.prefix = opts.prefix ?? 'gm:';
  }

  /** Connects to `url` (redis://…); REDIS_UNREACHABLE naming it when no answer comes. */
  static async connect(url: string, opts: DirectoryOptions = {}): Promise<Directory> {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new MeshError('BAD_REDIS_URL', `--redis ${url}: not a URL (redis://host:port or rediss://…)`);
    }
    if (parsed.protocol !== 'redis:' && parsed.protocol !== 'rediss:') throw new MeshError('BAD_REDIS_URL', `--redis ${url}: the scheme must be redis:// or rediss://`);
    // fail fast at start; once running, the client reconnects by itself and commands wait for it
    const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 2, connectTimeout: 3_000, retryStrategy: (n) => Math.min(n * 200, 2_000) });
    redis.on('error', () => undefined); // surfaced through commands; the client keeps reconnecting
    try {
      await redis.connect();
      await redis.ping();
    } catch (e) {
      redis.disconnect();
      throw new MeshError('REDIS_UNREACHABLE', `Redis at ${url} does not answer: ${(e as Error).message}`);
    }
    return new Directory(redis, opts);
  }

  private key(k: string): string {
    return this.prefix + k;
  }

  /** Whether Redis answered just now (health). */
  async reachable(): Promise<boolean> {
    try {
      return (await this.redis.ping()) === 'PONG';
    } catch {
      return false;
    }
  }

  /** Registers an instance: its number (unique while it lives) and its record, both expiring after `ttlMs` unless refreshed. */
  async register(id: string, url: string, ttlMs: number): Promise<InstanceRecord> {
    const seq = (await this.redis.incr(this.key('instance-seq'))) % 0xffff || 0xffff;
    const rec: InstanceRecord = { id, url, seq, startedAt: Date.now() };
    await this.refresh(rec, ttlMs);
    return rec;
  }

  /** Writes (or renews) the instance's record and number for another `ttlMs`. */
  async refresh(rec: InstanceRecord, ttlMs: number): Promise<void> {
    await this.redis.multi().set(this.key(`instance:${rec.id}`), JSON.stringify(rec), 'PX', ttlMs).set(this.key(`seq:${rec.seq}`), rec.id, 'PX', ttlMs).exec();
  }

  async deregister(rec: InstanceRecord): Promise<void> {
    await this.redis.del(this.key(`instance:${rec.id}`), this.key(`seq:${rec.seq}`));
  }

  async instance(id: string): Promise<InstanceRecord | null> {
    const v = await this.redis.get(this.key(`instance:${id}`));
    return v ? (JSON.parse(v) as InstanceRecord) : null;
  }

  /** The ids of the instances alive now (their records have not expired). */
  async instanceIds(): Promise<string[]> {
    const ids: string[] = [];
    let cursor = '0';
    do {
      const [next, keys] = await this.redis.scan(cursor, 'MATCH', this.key('instance:*'), 'COUNT', 100);
      cursor = next;
      for (const k of keys) ids.push(k.slice(this.key('instance:').length));
    } while (cursor !== '0');
    return ids;
  }

  /** The instance that holds number `seq` now (route ids carry it). */
  async instanceBySeq(seq: number): Promise<InstanceRecord | null> {
    const id = await this.redis.get(this.key(`seq:${seq}`));
    return id ? this.instance(id) : null;
  }

  /** The room's lease as it is after trying to take (or renew) it for `instance`. */
  async acquire(roomId: string, instance: string, ttlMs: number): Promise<Lease> {
    const v = (await this.redis.eval(ACQUIRE, 2, this.key(`room:${roomId}:lease`), this.key(`room:${roomId}:epoch`), instance, String(ttlMs))) as string;
    return JSON.parse(v) as Lease;
  }

  async lease(roomId: string): Promise<Lease | null> {
    const v = await this.redis.get(this.key(`room:${roomId}:lease`));
    return v ? (JSON.parse(v) as Lease) : null;
  }

  /** Gives the lease up if `lease` is still the current one. */
  async release(roomId: string, lease: Lease): Promise<boolean> {
    return (await this.redis.eval(RELEASE, 1, this.key(`room:${roomId}:lease`), lease.instance, String(lease.epoch))) === 1;
  }

  /** Publishes the room's state under `lease`; STALE_LEASE when the lease moved on (the write is refused). */
  async publishRoom(roomId: string, lease: Lease, state: unknown): Promise<void> {
    const ok = await this.redis.eval(FENCED_SET, 2, this.key(`room:${roomId}:lease`), this.key(`room:${roomId}:state`), lease.instance, String(lease.epoch), JSON.stringify({ ...(state as object), epoch: lease.epoch, instance: lease.instance }), '0');
    if (ok !== 1) throw new MeshError('STALE_LEASE', `room ${roomId}: the lease of epoch ${lease.epoch} is no longer ${lease.instance}'s; its write was refused`);
  }

  async roomState<T>(roomId: string): Promise<(T & { epoch: number; instance: string }) | null> {
    const v = await this.redis.get(this.key(`room:${roomId}:state`));
    return v ? (JSON.parse(v) as T & { epoch: number; instance: string }) : null;
  }

  /** Records that `instance` drives session `sessionId` (for `ttlMs`), under the room's lease. */
  async claimSession(sessionId: string, roomId: string, lease: Lease, ttlMs: number): Promise<void> {
    const ok = await this.redis.eval(FENCED_SET, 2, this.key(`room:${roomId}:lease`), this.key(`session:${sessionId}`), lease.instance, String(lease.epoch), lease.instance, String(ttlMs));
    if (ok !== 1) throw new MeshError('STALE_LEASE', `room ${roomId}: session ${sessionId} cannot be claimed under a lease that moved on`);
  }

  async sessionInstance(sessionId: string): Promise<string | null> {
    return this.redis.get(this.key(`session:${sessionId}`));
  }

  async dropSession(sessionId: string): Promise<void> {
    await this.redis.del(this.key(`session:${sessionId}`));
  }

  /** Starts (or, resumed, cuts back) a stream's journal. */
  async journalBegin(id: string, meta: JournalMeta, text: string, ttlMs: number): Promise<void> {
    const k = this.key(`stream:${id}`);
    await this.redis.multi().set(k, JSON.stringify(meta), 'PX', ttlMs).set(`${k}:text`, text, 'PX', ttlMs).exec().then(failed);
  }

  /** Adds the text a stream's client is about to be sent; both keys live another `ttlMs`. */
  async journalAppend(id: string, text: string, ttlMs: number): Promise<void> {
    const k = this.key(`stream:${id}`);
    await this.redis.multi().append(`${k}:text`, text).pexpire(`${k}:text`, ttlMs).pexpire(k, ttlMs).exec().then(failed);
  }

  async journalRead(id: string): Promise<JournalRecord | null> {
    const k = this.key(`stream:${id}`);
    const [meta, text] = await this.redis.mget(k, `${k}:text`);
    return meta && text !== null ? { ...(JSON.parse(meta) as JournalMeta), text } : null;
  }

  async journalDrop(id: string): Promise<void> {
    const k = this.key(`stream:${id}`);
    await this.redis.del(k, `${k}:text`);
  }

  async close(): Promise<void> {
    await this.redis.quit().catch(() => this.redis.disconnect());
  }
}

/** A MULTI's answers: the first command that failed inside it, thrown. */
function failed(results: Array<[Error | null, unknown]> | null): void {
  const e = results?.find(([err]) => err)?.[0];
  if (e) throw e;
  if (!results) throw new MeshError('REDIS_UNREACHABLE', 'Redis discarded a journal write (MULTI)');
}
