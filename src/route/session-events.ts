// Each session's telemetry stream: its last events kept for whoever subscribes late, and each
// new one told to the listeners of the moment.

import type { TelemetryEvent, TelemetryListener } from './telemetry.ts';
import { EVENT_BUFFER } from './session-types.ts';

export class SessionEvents {
  private listeners = new Map<string, Set<TelemetryListener>>();
  private buffers = new Map<string, TelemetryEvent[]>();

  publish(sessionId: string, e: TelemetryEvent): void {
    let buf = this.buffers.get(sessionId);
    if (!buf) this.buffers.set(sessionId, (buf = []));
    buf.push(e);
    if (buf.length > EVENT_BUFFER) buf.shift();
    for (const l of this.listeners.get(sessionId) ?? []) l(e);
  }

  /** Replays the session's kept events (unless `fromNow`), then delivers new ones until unsubscribed. */
  subscribe(sessionId: string, listener: TelemetryListener, fromNow: boolean): () => void {
    if (!fromNow) for (const e of this.buffers.get(sessionId) ?? []) listener(e);
    let set = this.listeners.get(sessionId);
    if (!set) this.listeners.set(sessionId, (set = new Set()));
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0) this.listeners.delete(sessionId);
    };
  }

  /** A finished session keeps only its last `keep` events. */
  trim(sessionId: string, keep: number): void {
    const buf = this.buffers.get(sessionId);
    if (buf && buf.length > keep) buf.splice(0, buf.length - keep);
  }

  forget(sessionId: string): void {
    this.buffers.delete(sessionId);
  }
}
