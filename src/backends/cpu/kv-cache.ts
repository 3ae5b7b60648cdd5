// The KV cache of one session on one stage: keys (after RoPE) and values of every position
// seen so far, for each layer of the shard. Capacity grows by doubling up to the session's
// context length, so a short chat does not reserve the whole context up front. Layers that
// attend through a recurrent state instead (Qwen3.5's Gated DeltaNet) hold no keys or values;
// their fixed-size state rides along in `recurrent`.

import { MeshError } from '../../errors.ts';
import type { RecurrentState } from './recurrent-state.ts';

const INITIAL_POSITIONS = 256;

export class KvCache {
  /** per layer of the shard: keys [capacity × kvDim] f32 */
  keys: Float32Array[];
  /** per layer of the shard: values [capacity × kvDim] f32 */
  values: Float32Array[];
  /** positions filled (= the next position expected) */
  length = 0;
  /** tokens each layer has processed since the session opened (index 0 = shard.start) */
  readonly processedTokens: number[];
  /** the recurrent layers' state (conv rows, delta-rule state), or null when every layer attends */
  recurrent: RecurrentState | null = null;
  private capacity: number;
  /** per shard layer: floats per position it keeps (0 for a recurrent layer) */
  private readonly widths: number[];

  constructor(
    readonly nLayers: number,
    /** floats per position per layer: n_head_kv × head_dim */
    readonly kvDim: number,
    /** most positions the session may hold */
    readonly contextLength: number,
    /** per shard layer: whether it keeps keys and values (default: all) */
    attends?: readonly boolean[],
  ) {
    this.capacity = Math.min(contextLength, INITIAL_POSITIONS);
    this.widths = Array.from({ length: nLayers }, (_, l) => (attends && !attends[l] ? 0 : kvDim));
    this.keys = this.widths.map((w) => new Float32Array(this.capacity * w));
    this.values = this.widths.map((w) => new Float32Array(this.capacity * w));
    this.processedTokens = new Array<number>(nLayers).fill(0);
  }

  /** bytes held by the keys and values of all layers */
  get bytes(): number {
    return 2 * this.widths.reduce((a, w) => a + w, 0) * this.capacity * 4;
  }

  /** Makes room for positions [length, length + nTokens); CONTEXT_FULL past contextLength. */
  reserve(nTokens: number): void {
    const needed = this.length + nTokens;
    if (needed > this.contextLength) {
      throw new MeshError(
        'CONTEXT_FULL',
        `session context is full: ${this.length} positions held + ${nTokens} new > context length ${this.contextLength}`,
      );
    }
    if (needed <= this.capacity) return;
    let capacity = this.capacity;
    while (capacity < needed) capacity *= 2;
    capacity = Math.min(capacity, this.contextLength);
    const grow = (old: Float32Array, l: number): Float32Array => {
      const w = this.widths[l]!;
      const next = new Float32Array(capacity * w);
      next.set(old.subarray(0, this.length * w));
      return next;
    };
    this.keys = this.keys.map(grow);
    this.values = this.values.map(grow);
    this.capacity = capacity;
  }

  /** drops the arrays so they can be collected */
  free(): void {
    this.keys = [];
    this.values = [];
    this.capacity = 0;
    this.recurrent?.free();
    this.recurrent = null;
  }
}
