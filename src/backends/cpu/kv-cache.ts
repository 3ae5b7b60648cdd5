// The KV cache of one session on one stage: keys (after RoPE) and values of every position
// seen so far, for each layer of the shard. Capacity grows by doubling up to the session's
// context length, so a short chat does not reserve the whole context up front.

import { MeshError } from '../../errors.ts';

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
  private capacity: number;

  constructor(
    readonly nLayers: number,
    /** floats per position per layer: n_head_kv × head_dim */
    readonly kvDim: number,
    /** most positions the session may hold */
    readonly contextLength: number,
  ) {
    this.capacity = Math.min(contextLength, INITIAL_POSITIONS);
    this.keys = Array.from({ length: nLayers }, () => new Float32Array(this.capacity * kvDim));
    this.values = Array.from({ length: nLayers }, () => new Float32Array(this.capacity * kvDim));
    this.processedTokens = new Array<number>(nLayers).fill(0);
  }

  /** bytes held by the keys and values of all layers */
  get bytes(): number {
    return 2 * this.nLayers * this.capacity * this.kvDim * 4;
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
    const grow = (old: Float32Array): Float32Array => {
      const next = new Float32Array(capacity * this.kvDim);
      next.set(old.subarray(0, this.length * this.kvDim));
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
  }
}
