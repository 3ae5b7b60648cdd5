// One session's Gated DeltaNet state on a WebGPU stage, with the CPU reference's rewind rules
// (../cpu/recurrent-state.ts): the state at the current 32-token chunk's start plus that
// chunk's rows, per DeltaNet layer of the shard. Every layer advances together, so where the
// chunk is (start, rows) is kept once, on the host.
//   - a rewind into the current chunk drops rows;
//   - a rewind to the position a forward started at (or back to its chunk's start), when that
//     forward crossed a chunk end, restores the copy taken at the start of that forward;
//   - a rewind to 0 clears the state;
//   - anything else is POSITION_MISMATCH: the caller replays from 0.

import { MeshError } from '../../errors.ts';
import type { LinearAttentionConfig } from '../../model/config.ts';
import { CHUNK } from '../cpu/delta-chunk.ts';
import { GpuDeltaState } from './delta-net.ts';
import type { GpuMemory } from './gpu-memory.ts';
import type { Recorder } from './kernels.ts';

interface Checkpoint {
  /** the position the forward started at */
  position: number;
  /** the chunk start then */
  start: number;
  /** per shard layer (null for attention layers) */
  states: (GpuDeltaState | null)[];
}

export class SessionRecurrent {
  /** per shard layer: its state, or null for a full-attention layer */
  readonly layers: (GpuDeltaState | null)[];
  /** absolute position of the current chunk's first token */
  start = 0;
  /** tokens of the current chunk seen so far */
  rows = 0;
  private checkpoint: Checkpoint | null = null;
  /** the checkpoint the forward in flight took, to restore when it fails */
  private pending: Checkpoint | null = null;

  constructor(
    private readonly memory: GpuMemory,
    private readonly sessionId: string,
    private readonly la: LinearAttentionConfig,
    recurrent: readonly boolean[],
  ) {
    this.layers = recurrent.map((r, l) => (r ? new GpuDeltaState(memory, `delta[${l}] ${sessionId}`, la) : null));
  }

  /** bytes held, the checkpoint included */
  get bytes(): number {
    const held = (states: (GpuDeltaState | null)[]) => states.reduce((a, s) => a + (s?.bytes ?? 0), 0);
    return held(this.layers) + (this.checkpoint ? held(this.checkpoint.states) : 0);
  }

  /** Before a forward of n tokens at `position`: one that will fold a chunk copies the state first, in `rec`. */
  beginForward(rec: Recorder, position: number, n: number): void {
    this.pending = null;
    if (this.rows + n < CHUNK) return;
    const cp = this.checkpoint ?? { position, start: this.start, states: this.layers.map((s, l) => (s ? new GpuDeltaState(this.memory, `delta checkpoint[${l}] ${this.sessionId}`, this.la) : null)) };
    cp.position = position;
    cp.start = this.start;
    cp.states.forEach((s, l) => s?.copyFrom(this.layers[l]!, rec));
    this.checkpoint = cp;
    this.pending = cp;
  }

  /** After a forward of n tokens succeeded. */
  advance(n: number): void {
    const end = this.start + this.rows + n;
    this.start = end - (end % CHUNK);
    this.rows = end % CHUNK;
    this.pending = null;
  }

  /** After a forward failed: the state goes back to where it started. */
  abandon(): void {
    const cp = this.pending;
    this.pending = null;
    if (cp) this.restore(cp, cp.position);
  }

  /** Rewinds to `position` (see the top of this file). */
  rewind(position: number): void {
    if (this.layers.every((s) => s === null)) return;
    if (position >= this.start) {
      this.rows = Math.min(this.rows, position - this.start);
      return;
    }
    const cp = this.checkpoint;
    if (cp && cp.start <= position && position <= cp.position) {
      this.restore(cp, position);
      return;
    }
    if (position === 0) {
      for (const s of this.layers) s?.clear();
      this.start = this.rows = 0;
      this.checkpoint = null;
      return;
    }
    throw new MeshError(
      'POSITION_MISMATCH',
      `session ${this.sessionId} keeps recurrent state from position ${cp?.start ?? this.start} on; it cannot rewind to ${position} (replay from 0 instead)`,
      { expected: cp?.start ?? this.start, got: position },
    );
  }

  free(): void {
    for (const s of [...this.layers, ...(this.checkpoint?.states ?? [])]) s?.free();
    this.checkpoint = null;
  }

  private restore(cp: Checkpoint, position: number): void {
    cp.states.forEach((s, l) => s && this.layers[l]!.copyFrom(s));
    this.start = cp.start;
    this.rows = position - cp.start;
    for (const s of cp.states) s?.free();
    this.checkpoint = null;
  }
}
