// The fixed-size recurrent state of one session on one stage, for the Gated DeltaNet layers of
// its shard (./delta-chunk.ts: the state at the current chunk's start plus that chunk's rows).
// Unlike a KV cache it does not grow with the context, and it cannot be cut back anywhere:
//   - a rewind into the current chunk drops rows (always possible: the last < CHUNK positions);
//   - a rewind to the position a forward started at, when that forward crossed a chunk end,
//     restores the checkpoint taken just before the chunk was folded (one per layer, taken at
//     most once per forward, so a decode step copies nothing until its chunk ends);
//   - a rewind to 0 clears the state;
//   - anything else is POSITION_MISMATCH: the caller rebuilds by replaying from 0 (issue 14's
//     rebuildSession does: a new stage 0 replays the session's token history).

import { MeshError } from '../../errors.ts';
import type { LinearAttentionConfig } from '../../model/config.ts';
import { DeltaChunkState, deltaLayerBytes } from './delta-chunk.ts';

export { deltaLayerBytes };

interface Checkpoint {
  /** the position the forward started at */
  position: number;
  state: DeltaChunkState;
}

export class RecurrentState {
  /** per shard layer: its state, or null for a full-attention layer */
  private layers: (DeltaChunkState | null)[];
  /** per shard layer: the state before the last forward that folded a chunk there */
  private checkpoints: (Checkpoint | null)[];
  private forwardStart = 0;
  private taken: boolean[] = [];

  constructor(
    private readonly la: LinearAttentionConfig,
    /** per shard layer: whether it is a DeltaNet layer */
    recurrent: readonly boolean[],
  ) {
    this.layers = recurrent.map((r) => (r ? new DeltaChunkState(la) : null));
    this.checkpoints = recurrent.map(() => null);
  }

  /** the state of shard layer l (a DeltaNet layer) */
  layer(l: number): DeltaChunkState {
    const s = this.layers[l];
    if (!s) throw new MeshError('INTERNAL', `shard layer ${l} holds no recurrent state`);
    return s;
  }

  /** Called before a forward at `position`: the next fold of each layer checkpoints it first. */
  beginForward(position: number): void {
    this.forwardStart = position;
    this.taken = this.layers.map(() => false);
  }

  /** what a layer's step calls before S₀ changes */
  beforeFold(l: number): () => void {
    return () => {
      if (this.taken[l]) return;
      this.taken[l] = true;
      const st = this.layer(l);
      const copy = this.checkpoints[l]?.state ?? new DeltaChunkState(this.la);
      copy.copyFrom(st);
      // rows past the forward's start were added by this forward: the checkpoint ends there
      copy.rows = this.forwardStart - st.start;
      this.checkpoints[l] = { position: this.forwardStart, state: copy };
    };
  }

  /** the state bytes the session holds, checkpoints included */
  get bytes(): number {
    const held = this.layers.filter((l) => l !== null).length + this.checkpoints.filter((c) => c !== null).length;
    return held * deltaLayerBytes(this.la);
  }

  /** Rewinds every DeltaNet layer to `position` (see the top of this file). */
  rewind(sessionId: string, position: number): void {
    // check every layer first, so a refused rewind changes nothing
    this.layers.forEach((st, l) => {
      if (!st || position >= st.start || position === 0) return;
      const cp = this.checkpoints[l];
      if (cp && cp.state.start <= position && position <= cp.position) return;
      throw new MeshError(
        'POSITION_MISMATCH',
        `session ${sessionId} keeps recurrent state from position ${cp?.state.start ?? st.start} on; it cannot rewind to ${position} (replay from 0 instead)`,
        { expected: cp?.state.start ?? st.start, got: position },
      );
    });
    this.layers.forEach((st, l) => {
      if (!st) return;
      if (position >= st.start) {
        st.rows = Math.min(st.rows, position - st.start);
        return;
      }
      const cp = this.checkpoints[l];
      if (cp && cp.state.start <= position && position <= cp.position) {
        st.copyFrom(cp.state);
        st.rows = position - st.start;
        this.checkpoints[l] = null;
        return;
      }
      this.layers[l] = new DeltaChunkState(this.la);
      this.checkpoints[l] = null;
    });
  }

  free(): void {
    this.layers = [];
    this.checkpoints = [];
  }
}
