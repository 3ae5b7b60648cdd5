// One session's KV cache on a stage: a key and a value buffer per layer of the shard, holding
// `capacity` positions of nHeadKv·headDim elements (f32, or f16 packed two to a u32). It starts
// at kvCapacity's first size and grows by doubling, the filled positions copied over inside the
// forward that needs the room. A cache larger than one storage binding may be (long contexts)
// is split by KV heads into parts that each fit: part p holds heads [h0, h0 + heads) as its own
// [capacity × heads·headDim] buffer, and attention runs per part.

import { MeshError } from '../../errors.ts';
import type { SessionStats } from '../types.ts';
import type { GpuMemory } from './gpu-memory.ts';
import type { Recorder } from './kernels.ts';
import { kvCapacity } from './kv-capacity.ts';
import type { SessionRecurrent } from './session-recurrent.ts';
import { BufferUsage } from './usage.ts';

const KV_USAGE = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST;

/** KV heads [h0, h0 + heads) of a cache split over buffers. */
export interface KvPart {
  h0: number;
  heads: number;
}

/**
 * How nHeadKv heads split so each part's buffer for `contextLength` positions fits `maxBinding`
 * bytes: one part when the whole cache fits. CONTEXT_TOO_LARGE when one head alone does not.
 */
export function kvParts(nHeadKv: number, headDim: number, elementBytes: number, contextLength: number, maxBinding: number): KvPart[] {
  const headBytes = contextLength * headDim * elementBytes;
  const perPart = Math.min(nHeadKv, Math.floor(maxBinding / headBytes));
  if (perPart < 1) {
    throw new MeshError('CONTEXT_TOO_LARGE', `a ${contextLength}-position KV cache needs ${headBytes} bytes per head per layer, over this device's ${maxBinding}-byte binding limit`);
  }
  const parts: KvPart[] = [];
  for (let h0 = 0; h0 < nHeadKv; h0 += perPart) parts.push({ h0, heads: Math.min(perPart, nHeadKv - h0) });
  return parts;
}

/** What `grow` changes, saved before a forward that may fail (SessionKv.save). */
export interface SavedKv {
  keys: GPUBuffer[][];
  values: GPUBuffer[][];
  capacity: number;
  kvBytes: number;
}

export class SessionKv {
  /** positions the cache buffers hold now (grown by doubling up to contextLength) */
  capacity: number;
  position = 0;
  readonly processedTokens: number[];
  /** per layer, per part: [capacity × part heads·headDim] f32 or packed f16, RoPE applied */
  keys: GPUBuffer[][] = [];
  /** per layer, per part: [capacity × part heads·headDim] f32 or packed f16 */
  values: GPUBuffer[][] = [];
  kvBytes: number;
  /** the Gated DeltaNet layers' state (Qwen3.5), or null when every layer attends */
  recurrent: SessionRecurrent | null = null;
  /** layers holding keys and values (a DeltaNet layer holds none) */
  private readonly kvLayers: number;

  constructor(
    private readonly memory: GpuMemory,
    private readonly sessionId: string,
    readonly contextLength: number,
    /** elements per position per layer: nHeadKv · headDim */
    private readonly kvDim: number,
    private readonly elementBytes: number,
    private readonly nLayers: number,
    /** the split by KV heads (one part: unsplit) */
    readonly parts: readonly KvPart[] = [{ h0: 0, heads: 1 }],
    private readonly headDim: number = kvDim,
    /** per shard layer: whether it attends (default: all) */
    private readonly attends: readonly boolean[] = new Array<boolean>(nLayers).fill(true),
  ) {
    this.capacity = kvCapacity(0, 1, contextLength);
    this.processedTokens = new Array<number>(nLayers).fill(0);
    this.kvLayers = attends.filter(Boolean).length;
    this.kvBytes = 2 * this.kvLayers * this.capacity * kvDim * elementBytes;
  }

  /** elements per position of part p */
  partWidth(p: number): number {
    return this.parts.length === 1 ? this.kvDim : this.parts[p]!.heads * this.headDim;
  }

  /** creates the first buffers (in the caller's error scopes) */
  allocate(): void {
    for (let l = 0; l < this.nLayers; l++) {
      if (!this.attends[l]) {
        this.keys.push([]);
        this.values.push([]);
        continue;
      }
      this.keys.push(this.parts.map((_, p) => this.memory.create(`k[${l}.${p}] ${this.sessionId}`, this.capacity * this.partWidth(p) * this.elementBytes, KV_USAGE)));
      this.values.push(this.parts.map((_, p) => this.memory.create(`v[${l}.${p}] ${this.sessionId}`, this.capacity * this.partWidth(p) * this.elementBytes, KV_USAGE)));
    }
  }

  /**
   * Makes the cache hold `needed` positions: bigger buffers, with the filled positions copied
   * over at the start of `rec`'s submission. The caller saved the cache first: it commits once
   * the submission succeeded (the old buffers are freed) or restores it after a failure.
   */
  grow(rec: Recorder, needed: number): void {
    if (needed <= this.capacity) return;
    const capacity = kvCapacity(this.capacity, needed, this.contextLength);
    const eb = this.elementBytes;
    const made: GPUBuffer[] = [];
    const grow = (old: GPUBuffer[][], name: string) =>
      old.map((parts, l) =>
        parts.map((b, p) => {
          const bigger = this.memory.create(`${name}[${l}.${p}] ${this.sessionId}`, capacity * this.partWidth(p) * eb, KV_USAGE);
          made.push(bigger);
          const filled = this.position * this.partWidth(p) * eb;
          if (filled > 0) rec.copyBefore(b, bigger, filled);
          return bigger;
        }),
      );
    let keys: GPUBuffer[][], values: GPUBuffer[][];
    try {
      keys = grow(this.keys, 'k');
      values = grow(this.values, 'v');
    } catch (e) {
      // nothing replaced yet: the cache stays as it was
      for (const b of made) this.memory.destroy(b);
      throw e;
    }
    this.keys = keys;
    this.values = values;
    this.capacity = capacity;
    this.kvBytes = 2 * this.kvLayers * capacity * this.kvDim * eb;
  }

  /** the buffers a forward may replace by growing: for restore (it failed) or commit (it succeeded) */
  save(): SavedKv {
    return { keys: this.keys, values: this.values, capacity: this.capacity, kvBytes: this.kvBytes };
  }

  /** back to `saved` after a forward that failed: the buffers grown since are freed, the old ones (intact: their copy never ran) kept */
  restore(saved: SavedKv): void {
    this.freeAllBut(saved, this);
    this.keys = saved.keys;
    this.values = saved.values;
    this.capacity = saved.capacity;
    this.kvBytes = saved.kvBytes;
  }

  /** after a forward that succeeded: frees the buffers of `saved` that growing replaced */
  commit(saved: SavedKv): void {
    this.freeAllBut(this, saved);
  }

  /** frees the buffers of `from` that `keep` does not hold */
  private freeAllBut(keep: SavedKv | SessionKv, from: SavedKv | SessionKv): void {
    const kept = new Set([...keep.keys.flat(), ...keep.values.flat()]);
    for (const b of [...from.keys.flat(), ...from.values.flat()]) if (!kept.has(b)) this.memory.destroy(b);
  }

  /** records that every layer of the shard took `n` more positions */
  advance(n: number): void {
    this.position += n;
    for (let l = 0; l < this.processedTokens.length; l++) this.processedTokens[l]! += n;
  }

  stats(): SessionStats {
    return { position: this.position, kvBytes: this.kvBytes, processedTokens: [...this.processedTokens], ...(this.recurrent ? { recurrentBytes: this.recurrent.bytes } : {}) };
  }

  free(): void {
    for (const b of [...this.keys.flat(), ...this.values.flat()]) this.memory.destroy(b);
    this.keys = [];
    this.values = [];
    this.recurrent?.free();
    this.recurrent = null;
  }
}
