// One session's KV cache on a stage: a key and a value buffer per layer of the shard, holding
// `capacity` positions of nHeadKv·headDim elements (f32, or f16 packed two to a u32). It starts
// at kvCapacity's first size and grows by doubling, the filled positions copied over inside the
// forward that needs the room.

import type { SessionStats } from '../types.ts';
import type { GpuMemory } from './gpu-memory.ts';
import type { Recorder } from './kernels.ts';
import { kvCapacity } from './kv-capacity.ts';
import { BufferUsage } from './usage.ts';

const KV_USAGE = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST;

export class SessionKv {
  /** positions the cache buffers hold now (grown by doubling up to contextLength) */
  capacity: number;
  position = 0;
  readonly processedTokens: number[];
  keys: GPUBuffer[] = []; // per layer [capacity × kvDim] f32 or packed f16, RoPE applied
  values: GPUBuffer[] = []; // per layer [capacity × kvDim] f32 or packed f16
  kvBytes: number;

  constructor(
    private readonly memory: GpuMemory,
    private readonly sessionId: string,
    readonly contextLength: number,
    /** elements per position per layer: nHeadKv · headDim */
    private readonly kvDim: number,
    private readonly elementBytes: number,
    private readonly nLayers: number,
  ) {
    this.capacity = kvCapacity(0, 1, contextLength);
    this.processedTokens = new Array<number>(nLayers).fill(0);
    this.kvBytes = 2 * nLayers * this.capacity * kvDim * elementBytes;
  }

  /** creates the first buffers (in the caller's error scopes) */
  allocate(): void {
    const bytes = this.capacity * this.kvDim * this.elementBytes;
    for (let l = 0; l < this.nLayers; l++) {
      this.keys.push(this.memory.create(`k[${l}] ${this.sessionId}`, bytes, KV_USAGE));
      this.values.push(this.memory.create(`v[${l}] ${this.sessionId}`, bytes, KV_USAGE));
    }
  }

  /**
   * Makes the cache hold `needed` positions: bigger buffers, with the filled positions copied
   * over at the start of `rec`'s submission. Returns the old buffers, to free once that
   * submission is made.
   */
  grow(rec: Recorder, needed: number): GPUBuffer[] {
    if (needed <= this.capacity) return [];
    const capacity = kvCapacity(this.capacity, needed, this.contextLength);
    const eb = this.elementBytes;
    const filled = this.position * this.kvDim * eb;
    const grow = (old: GPUBuffer[], name: string) =>
      old.map((b, l) => {
        const bigger = this.memory.create(`${name}[${l}] ${this.sessionId}`, capacity * this.kvDim * eb, KV_USAGE);
        if (filled > 0) rec.copyBefore(b, bigger, filled);
        return bigger;
      });
    const retired = [...this.keys, ...this.values];
    this.keys = grow(this.keys, 'k');
    this.values = grow(this.values, 'v');
    this.capacity = capacity;
    this.kvBytes = 2 * this.keys.length * capacity * this.kvDim * eb;
    return retired;
  }

  /** records that every layer of the shard took `n` more positions */
  advance(n: number): void {
    this.position += n;
    for (let l = 0; l < this.processedTokens.length; l++) this.processedTokens[l]! += n;
  }

  stats(): SessionStats {
    return { position: this.position, kvBytes: this.kvBytes, processedTokens: [...this.processedTokens] };
  }

  free(): void {
    for (const b of [...this.keys, ...this.values]) this.memory.destroy(b);
    this.keys = [];
    this.values = [];
  }
}
