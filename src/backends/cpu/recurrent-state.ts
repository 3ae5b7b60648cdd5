// The fixed-size recurrent state of one session on one stage, for the Gated DeltaNet layers of
// its shard: the conv's last K − 1 input rows and the delta-rule state per v head. Unlike a KV
// cache it does not grow with the context — and it cannot be cut back to an earlier position,
// so it keeps one checkpoint: the state as it was before the last forward call. A rewind to
// that position (a repair re-sending the step in flight) restores it; a rewind to 0 clears the
// state; any other position is POSITION_MISMATCH, and the caller rebuilds by replaying from 0
// (issue 14's rebuildSession does: a new stage 0 replays the session's token history).

import { MeshError } from '../../errors.ts';
import type { LinearAttentionConfig } from '../../model/config.ts';

/** f32 bytes of one DeltaNet layer's state: conv rows + delta-rule state. */
export function recurrentLayerBytes(la: LinearAttentionConfig): number {
  return 4 * ((la.convKernel - 1) * la.convChannels + la.nVHeads * la.headDim * la.headDim);
}

interface LayerState {
  /** [(K − 1) × convChannels] the conv's carried input rows, oldest first */
  conv: Float32Array;
  /** [nV × d_v × d_k] per v head, s[j·d_k + i] = S[i][j] */
  ssm: Float32Array;
}

export class RecurrentState {
  /** per shard layer: its state, or null for a full-attention layer */
  private layers: (LayerState | null)[];
  private checkpoint: { position: number; layers: (LayerState | null)[] } | null = null;

  constructor(
    private readonly la: LinearAttentionConfig,
    /** per shard layer: whether it is a DeltaNet layer */
    recurrent: readonly boolean[],
  ) {
    this.layers = recurrent.map((r) => (r ? this.fresh() : null));
  }

  /** the conv rows and delta-rule state of shard layer l (a DeltaNet layer) */
  layer(l: number): LayerState {
    const s = this.layers[l];
    if (!s) throw new MeshError('INTERNAL', `shard layer ${l} holds no recurrent state`);
    return s;
  }

  /** the state bytes the session holds, the checkpoint included */
  get bytes(): number {
    const n = this.layers.filter((l) => l !== null).length;
    return n * recurrentLayerBytes(this.la) * (this.checkpoint ? 2 : 1);
  }

  /** Called before a forward at `position`: keeps a copy to rewind to. */
  saveCheckpoint(position: number): void {
    const copy = (s: LayerState | null): LayerState | null => s && { conv: s.conv.slice(), ssm: s.ssm.slice() };
    if (this.checkpoint && this.checkpoint.layers.length === this.layers.length) {
      // reuse the buffers of the previous checkpoint
      this.checkpoint.layers.forEach((c, i) => {
        if (c) {
          c.conv.set(this.layers[i]!.conv);
          c.ssm.set(this.layers[i]!.ssm);
        }
      });
      this.checkpoint.position = position;
    } else {
      this.checkpoint = { position, layers: this.layers.map(copy) };
    }
  }

  /** Rewinds from `current` to `position` (0, the checkpoint, or current); else POSITION_MISMATCH. */
  rewind(sessionId: string, position: number, current: number): void {
    if (position === current) return;
    if (position === 0) {
      this.layers = this.layers.map((s) => s && this.fresh());
      this.checkpoint = null;
      return;
    }
    if (this.checkpoint?.position === position) {
      const cp = this.checkpoint;
      this.checkpoint = null;
      this.layers = cp.layers;
      return;
    }
    throw new MeshError(
      'POSITION_MISMATCH',
      `session ${sessionId} holds recurrent state at position ${current} with a checkpoint at ${this.checkpoint?.position ?? 'none'}; it cannot rewind to ${position} (replay from 0 instead)`,
      { expected: this.checkpoint?.position ?? 0, got: position },
    );
  }

  free(): void {
    this.layers = [];
    this.checkpoint = null;
  }

  private fresh(): LayerState {
    const { convKernel, convChannels, nVHeads, headDim } = this.la;
    return { conv: new Float32Array((convKernel - 1) * convChannels), ssm: new Float32Array(nVHeads * headDim * headDim) };
  }
}
