// The KV cache of one session on one stage, inside the CPU engine's WasmArena: keys (after
// RoPE) and values of every position seen so far, for each layer of the shard. Laid out so
// attention is two plain matrix products per head (./attention.ts), as ggml lays out its
// non-flash-attention cache:
//
//   K of layer l, KV head h:  [capacity × headDim]   (a row per position: scores = K · q)
//   V of layer l, KV head h:  [headDim × capacity]   (transposed: out = Vᵀ · p)
//
// Capacity grows by doubling up to the session's context length (a short chat does not reserve
// the whole context up front); growing moves the cache head by head, in place where the cache
// ends the arena. Capacity is a multiple of 4, so kernels can read positions in fours; unused
// positions stay zero. Layers that attend through a recurrent state instead (Qwen3.5's Gated
// DeltaNet) hold no keys or values in the region; their fixed-size state rides along in
// `recurrent` (./recurrent-state.ts, plain f32 arrays outside the arena).

import { MeshError } from '../../errors.ts';
import type { RecurrentState } from './recurrent-state.ts';
import type { WasmArena } from './wasm-arena.ts';

const INITIAL_POSITIONS = 256;

export class KvCache {
  /** positions filled (= the next position expected) */
  length = 0;
  /** tokens each layer has processed since the session opened (index 0 = shard.start) */
  readonly processedTokens: number[];
  /** positions the cache holds now */
  capacity: number;
  /** the recurrent layers' state (conv rows, delta-rule state), or null when every layer attends */
  recurrent: RecurrentState | null = null;
  /** byte offset of the cache's region: per attending layer K then V, each nHeadKv × capacity × headDim f32 */
  private base: number;
  /** per shard layer: its place among the attending layers in the region (-1: keeps no K/V) */
  private readonly slots: number[];
  /** layers that keep keys and values */
  private readonly nSlots: number;

  constructor(
    readonly arena: WasmArena,
    readonly nLayers: number,
    readonly nHeadKv: number,
    readonly headDim: number,
    /** most positions the session may hold */
    readonly contextLength: number,
    /** per shard layer: whether it keeps keys and values (default: all) */
    attends?: readonly boolean[],
  ) {
    let next = 0;
    this.slots = Array.from({ length: nLayers }, (_, l) => (attends && !attends[l] ? -1 : next++));
    this.nSlots = next;
    this.capacity = round4(Math.min(contextLength, INITIAL_POSITIONS));
    this.base = arena.alloc(this.regionBytes(this.capacity), true);
    this.processedTokens = new Array<number>(nLayers).fill(0);
  }

  /** floats per position per layer: nHeadKv × headDim */
  get kvDim(): number {
    return this.nHeadKv * this.headDim;
  }

  /** bytes held by the keys and values of all layers */
  get bytes(): number {
    return this.regionBytes(this.capacity);
  }

  /** byte offset of K for layer l, KV head h: [capacity × headDim] */
  keys(l: number, h: number): number {
    return this.base + ((2 * this.slots[l]! * this.nHeadKv + h) * this.capacity * this.headDim) * 4;
  }

  /** byte offset of Vᵀ for layer l, KV head h: [headDim × capacity] */
  values(l: number, h: number): number {
    return this.base + (((2 * this.slots[l]! + 1) * this.nHeadKv + h) * this.capacity * this.headDim) * 4;
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
    capacity = round4(Math.min(capacity, this.contextLength));
    // at the end of the arena the region grows where it is, and each (layer, K|V, head) run moves
    // up from the last one down (a run's new place starts at or after its old one); elsewhere it
    // moves to a new region
    const inPlace = this.arena.growInPlace(this.base, this.regionBytes(capacity));
    const next = inPlace ? this.base : this.arena.alloc(this.regionBytes(capacity), true);
    const heap = this.arena.heap;
    const old = this.base >> 2, now = next >> 2;
    const { headDim: hd, length: n } = this;
    for (let run = 2 * this.nSlots * this.nHeadKv - 1; run >= 0; run--) {
      const at = run * hd; // floats before this run, per position of capacity
      const isV = Math.floor(run / this.nHeadKv) % 2 === 1;
      if (!isV) {
        heap.copyWithin(now + at * capacity, old + at * this.capacity, old + at * this.capacity + n * hd);
        if (inPlace) heap.fill(0, now + at * capacity + n * hd, now + (at + hd) * capacity);
        continue;
      }
      for (let d = hd - 1; d >= 0; d--) {
        const from = old + (at + d) * this.capacity;
        heap.copyWithin(now + (at + d) * capacity, from, from + n);
        if (inPlace) heap.fill(0, now + (at + d) * capacity + n, now + (at + d + 1) * capacity);
      }
    }
    if (!inPlace) this.arena.free(this.base);
    this.base = next;
    this.capacity = capacity;
  }

  /**
   * Writes keys and values of nTokens positions from `pos` for layer l.
   * k, v: [nTokens × nHeadKv × headDim] (keys already rotated)
   */
  write(l: number, pos: number, k: Float32Array, v: Float32Array, nTokens: number): void {
    const heap = this.arena.heap;
    const { headDim: hd, capacity: cap, kvDim } = this;
    for (let h = 0; h < this.nHeadKv; h++) {
      const kh = this.keys(l, h) >> 2, vh = this.values(l, h) >> 2;
      for (let t = 0; t < nTokens; t++) {
        const src = t * kvDim + h * hd;
        heap.set(k.subarray(src, src + hd), kh + (pos + t) * hd);
        for (let d = 0; d < hd; d++) heap[vh + d * cap + pos + t] = v[src + d]!;
      }
    }
  }

  /**
   * Drops positions [position, length) (a session rolled back): they are zeroed, as positions
   * never written are, so the kernels that read keys and values in fours past the causal limit
   * see the same zeros as before and a replayed token's result is the same bit for bit.
   */
  truncate(position: number): void {
    const heap = this.arena.heap;
    const { headDim: hd, capacity: cap, length: n } = this;
    for (let l = 0; l < this.nLayers; l++) {
      if (this.slots[l]! < 0) continue;
      for (let h = 0; h < this.nHeadKv; h++) {
        const kh = this.keys(l, h) >> 2, vh = this.values(l, h) >> 2;
        heap.fill(0, kh + position * hd, kh + n * hd);
        for (let d = 0; d < hd; d++) heap.fill(0, vh + d * cap + position, vh + d * cap + n);
      }
    }
    this.length = position;
  }

  /** returns the region to the arena */
  free(): void {
    if (this.base >= 0) this.arena.free(this.base);
    this.base = -1;
    this.capacity = 0;
    this.recurrent?.free();
    this.recurrent = null;
  }

  private regionBytes(capacity: number): number {
    return 2 * this.nSlots * this.nHeadKv * capacity * this.headDim * 4;
  }
}

function round4(n: number): number {
  return Math.ceil(n / 4) * 4;
}
