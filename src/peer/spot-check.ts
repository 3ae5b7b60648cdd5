// A public room's spot check, on the peer side. The trusted first stage also holds the layers
// of the untrusted stages after it (the assignment's `check` shard): for a fraction of sessions,
// chosen here so no donor can tell which, it runs those layers again over exactly the hidden
// states it sent on, and reports the last row it expects to come out ('expected'). The trusted
// last stage reports the last row of what actually arrived for the sessions the server tells
// it to watch ('actual'). The server compares the two (signaling-server/spot-check.ts).

import { MeshError } from '../errors.ts';
import type { StageBackend } from '../backends/types.ts';
import type { Frame } from '../protocol/frame.ts';
import { toBase64 } from '../protocol/control.ts';
import type { PeerToServer } from '../protocol/control.ts';
import type { ComputeQueue } from './compute-queue.ts';

export interface SpotCheckOptions {
  /** the untrusted stages' layers, loaded on this (first) stage; absent on the last stage */
  backend?: StageBackend;
  /** the fraction of sessions re-run (0..1) */
  fraction: number;
  send: (m: PeerToServer) => void;
  random?: () => number;
}

/** The last row of [n × width] rows, as base64 of f32 little-endian. */
function lastRow(rows: Float32Array, nTokens: number): string {
  const width = rows.length / nTokens;
  const row = rows.slice((nTokens - 1) * width);
  return toBase64(new Uint8Array(row.buffer, row.byteOffset, row.byteLength));
}

export class SpotCheck {
  /** sessions this first stage re-runs */
  private readonly sampled = new Set<string>();
  /** sessions this last stage reports for */
  private readonly watched = new Set<string>();

  constructor(private readonly opts: SpotCheckOptions) {}

  /** A session opened: re-run it (the check layers get a KV cache of their own) with probability `fraction`. */
  async open(sessionId: string, contextLength: number): Promise<void> {
    const b = this.opts.backend;
    if (!b || (this.opts.random ?? Math.random)() >= this.opts.fraction) return;
    await b.openSession(sessionId, { contextLength });
    this.sampled.add(sessionId);
  }

  async close(sessionId: string): Promise<void> {
    this.watched.delete(sessionId);
    if (this.sampled.delete(sessionId)) await this.opts.backend!.releaseSession(sessionId).catch(() => undefined);
  }

  /** A Rewind (repair, or a client continuing a kept session): the re-run forgets positions from `position` on too. */
  async rewind(sessionId: string, position: number): Promise<void> {
    if (this.sampled.has(sessionId)) await this.opts.backend!.truncateSession(sessionId, position).catch(() => void this.close(sessionId));
  }

  watch(sessionId: string): void {
    this.watched.add(sessionId);
  }

  /**
   * First stage: `out` (the Hidden frame just sent on) goes through the check layers as its own
   * queued job, after this stage's work; the last row they give is reported. A check that fails
   * ends checking for that session, never the session.
   */
  expected<S>(queue: ComputeQueue<S>, out: Frame, rows: () => Float32Array): void {
    const sid = out.sessionId;
    const b = this.opts.backend;
    if (!b || !this.sampled.has(sid)) return;
    const hidden = rows();
    void queue
      .run(sid, 'prefill', () => b.forward(sid, { kind: 'hidden', hidden, nTokens: out.nTokens }, out.position))
      .then(({ value }) => {
        if (value.output.kind !== 'hidden') throw new MeshError('STAGE_FAILED', 'the check layers gave logits');
        this.opts.send({ t: 'check', routeId: out.routeId, sessionId: sid, position: out.position, nTokens: out.nTokens, role: 'expected', row: lastRow(value.output.hidden, out.nTokens) });
      })
      .catch(() => void this.close(sid));
  }

  /** Last stage: the hidden states that arrived for a watched session. */
  actual(f: Frame, rows: () => Float32Array): void {
    if (!this.watched.has(f.sessionId)) return;
    this.opts.send({ t: 'check', routeId: f.routeId, sessionId: f.sessionId, position: f.position, nTokens: f.nTokens, role: 'actual', row: lastRow(rows(), f.nTokens) });
  }

  async releaseAll(): Promise<void> {
    for (const sid of [...this.sampled]) await this.close(sid);
    this.watched.clear();
  }
}
