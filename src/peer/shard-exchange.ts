// Shards from other peers: a tab that holds verified units of the artifact in its shard cache
// serves their tensors to a peer that is loading them, over a WebRTC data channel of its own
// (signalled through the server like a stage's hop, connection ids prefixed `shard-`). The
// loader verifies every tensor against the manifest on arrival, exactly as bytes from the
// server's model hosting (slice-loader.ts), and fetches whatever a peer did not give from the
// server. The server names the sources in `assign`/`standby`: peers holding the whole shard.
//
// Messages on the channel: one kind byte, then the body. 1 = JSON ({t:'get', id, names} from
// the loading side; {t:'tensor', id, name, bytes} before a tensor's chunks and {t:'done', id,
// missing} after the last), 2 = a chunk of the tensor announced last.

import { MeshError } from '../errors.ts';
import type { Manifest } from '../gguf/verify.ts';
import type { SignalFromPeer } from '../protocol/control.ts';
import type { ShardCache } from '../storage/shard-cache.ts';
import { unitTensorNames } from '../storage/shard-cache.ts';
import { connectDataChannel } from '../transport/webrtc.ts';
import type { DataChannelPipe } from '../transport/webrtc.ts';

const JSON_KIND = 1;
const CHUNK_KIND = 2;
export const SHARD_CID_PREFIX = 'shard-';

type Request = { t: 'get'; id: number; names: string[] };
type Reply = { t: 'tensor'; id: number; name: string; bytes: number } | { t: 'done'; id: number; missing: string[] };

export interface ShardExchangeOptions {
  manifest: Manifest;
  cache: ShardCache | null;
  sendJson: (m: unknown) => void;
  iceServers?: () => RTCIceServer[] | undefined;
  iceTransportPolicy?: RTCIceTransportPolicy;
  timeoutMs?: number;
  /** after each request this tab answered (the counters changed) */
  onServed?: () => void;
  log: (line: string) => void;
}

/** What this tab gave other peers. */
export interface ExchangeCounters {
  servedTensors: number;
  servedBytes: number;
}

const encodeJson = (m: Request | Reply): Uint8Array => {
  const body = new TextEncoder().encode(JSON.stringify(m));
  const out = new Uint8Array(body.length + 1);
  out[0] = JSON_KIND;
  out.set(body, 1);
  return out;
};

export class ShardExchange {
  readonly counters: ExchangeCounters = { servedTensors: 0, servedBytes: 0 };
  private readonly sinks = new Map<string, (s: unknown) => void>();
  private readonly pipes = new Set<DataChannelPipe>();

  constructor(private readonly o: ShardExchangeOptions) {}

  /** Whether a signal belongs to a shard channel (else it is a stage hop's). */
  static owns(m: SignalFromPeer): boolean {
    return String(m.cid).startsWith(SHARD_CID_PREFIX);
  }

  onSignal(m: SignalFromPeer): void {
    const key = `${m.from}#${m.cid}`;
    const sink = this.sinks.get(key);
    if (sink) return sink(m.signal);
    if (!this.o.cache) return; // nothing to serve
    void this.serve(m.from, String(m.cid), m.signal);
  }

  private open(peer: string, cid: string, initiator: boolean, first?: unknown): Promise<DataChannelPipe> {
    const key = `${peer}#${cid}`;
    const pending: unknown[] = first === undefined ? [] : [first];
    let deliver: ((s: unknown) => void) | null = null;
    this.sinks.set(key, (s) => (deliver ? deliver(s) : pending.push(s)));
    const ice = this.o.iceServers?.();
    return connectDataChannel({
      initiator,
      label: `${peer} (shard bytes)`,
      timeoutMs: this.o.timeoutMs ?? 10_000,
      ...(ice ? { iceServers: ice } : {}),
      ...(this.o.iceTransportPolicy ? { iceTransportPolicy: this.o.iceTransportPolicy } : {}),
      signal: {
        send: (s) => this.o.sendJson({ t: 'signal', to: peer, cid, signal: s }),
        onSignal: (cb) => {
          deliver = cb;
          for (const s of pending.splice(0)) cb(s);
        },
      },
    }).then(
      (pipe) => {
        this.pipes.add(pipe);
        pipe.onClose(() => {
          this.pipes.delete(pipe);
          this.sinks.delete(key);
        });
        return pipe;
      },
      (e: unknown) => {
        this.sinks.delete(key);
        throw e;
      },
    );
  }

  /** Answers a peer's channel and serves its requests from this tab's verified cache. */
  private async serve(from: string, cid: string, first: unknown): Promise<void> {
    let pipe: DataChannelPipe;
    try {
      pipe = await this.open(from, cid, false, first);
    } catch (e) {
      return this.o.log(`no shard channel from ${from}: ${(e as Error).message}`);
    }
    let queue = Promise.resolve();
    pipe.onMessage((msg) => {
      if (msg[0] !== JSON_KIND) return;
      const req = JSON.parse(new TextDecoder().decode(msg.subarray(1))) as Request;
      if (req.t !== 'get' || !Array.isArray(req.names)) return;
      queue = queue.then(() => this.answer(pipe, req)).catch((e: Error) => this.o.log(`serving shard bytes to ${from} failed: ${e.message}`));
    });
  }

  private async answer(pipe: DataChannelPipe, req: Request): Promise<void> {
    const { manifest, cache } = this.o;
    const names = req.names.map(String);
    const units = manifest.groups.map((g) => g.name).filter((u) => unitTensorNames(manifest, u).some((n) => names.includes(n)));
    // the cache re-hashes what it reads: only verified bytes leave this tab
    const { result } = await cache!.readUnits(manifest, units);
    const missing: string[] = [];
    const chunk = pipe.maxMessageSize - 1;
    for (const name of names) {
      const bytes = result.tensors.get(name);
      if (!bytes) {
        missing.push(name);
        continue;
      }
      await pipe.send(encodeJson({ t: 'tensor', id: req.id, name, bytes: bytes.byteLength }));
      for (let at = 0; at < bytes.byteLength; at += chunk) {
        const part = bytes.subarray(at, Math.min(bytes.byteLength, at + chunk));
        const m = new Uint8Array(part.byteLength + 1);
        m[0] = CHUNK_KIND;
        m.set(part, 1);
        await pipe.send(m);
      }
      this.counters.servedTensors++;
      this.counters.servedBytes += bytes.byteLength;
    }
    await pipe.send(encodeJson({ t: 'done', id: req.id, missing }));
    this.o.onServed?.();
  }

  /**
   * Asks `peer` for tensors `names`: resolves with those it sent (unverified: the caller checks
   * them against the manifest), and rejects when no channel opens or it closes mid-way.
   */
  async fetch(peer: string, names: readonly string[]): Promise<Map<string, Uint8Array>> {
    const cid = `${SHARD_CID_PREFIX}${Math.random().toString(36).slice(2, 10)}`;
    const pipe = await this.open(peer, cid, true);
    try {
      return await new Promise<Map<string, Uint8Array>>((resolve, reject) => {
        const got = new Map<string, Uint8Array>();
        let current: { name: string; bytes: Uint8Array; at: number } | null = null;
        pipe.onClose((r) => reject(r));
        pipe.onMessage((msg) => {
          if (msg[0] === CHUNK_KIND) {
            if (!current || current.at + msg.byteLength - 1 > current.bytes.byteLength) return reject(new MeshError('BAD_MESSAGE', `peer ${peer} sent bytes past the tensor it announced`));
            current.bytes.set(msg.subarray(1), current.at);
            current.at += msg.byteLength - 1;
            if (current.at === current.bytes.byteLength) got.set(current.name, current.bytes);
            return;
          }
          const m = JSON.parse(new TextDecoder().decode(msg.subarray(1))) as Reply;
          if (m.t === 'tensor') {
            const entry = this.o.manifest.tensors.find((t) => t.name === m.name);
            // a size the manifest does not give is refused before anything is allocated
            if (!entry || entry.byte_length !== m.bytes || !names.includes(m.name)) return reject(new MeshError('BAD_MESSAGE', `peer ${peer} offered '${m.name}' (${m.bytes} bytes), which was not asked for`));
            current = { name: m.name, bytes: new Uint8Array(m.bytes), at: 0 };
            if (m.bytes === 0) got.set(m.name, current.bytes);
          } else if (m.t === 'done') resolve(got);
        });
        void pipe.send(encodeJson({ t: 'get', id: 1, names: [...names] })).catch(reject);
      });
    } finally {
      pipe.close();
    }
  }

  close(): void {
    for (const p of this.pipes) p.close();
    this.pipes.clear();
    this.sinks.clear();
  }
}
